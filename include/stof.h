/*
 * stof.h - public API of stof, a library that makes masked ("sparse")
 * Transformer inference fast on NVIDIA GPUs.
 *
 * This header is the whole contract with users. It needs no CUDA header:
 * device pointers are passed as `void *` / `const void *` and streams as
 * `void *` (a CUstream or a cudaStream_t; NULL is the legacy default stream).
 *
 * Conventions
 * - Every function that can fail returns a stof_status. STOF_OK is 0.
 *   The detailed message of the last failure on a context is returned by
 *   stof_errmsg(ctx): it names the offending argument, quotes the position in
 *   a mask spec, or carries the NVRTC log / CUDA error name.
 * - Objects are created through an out-parameter (marked OUT) and destroyed
 *   through a double pointer that is set to NULL. Destroying NULL is harmless.
 * - Whatever stof allocates, stof frees. Strings leave stof only through
 *   caller buffers; such functions report the size they needed.
 * - Threads: a stof_context and everything made from it may be used by one
 *   thread at a time (like an SQLite connection in multi-thread mode). Use
 *   one context per thread, or serialise. stof_status_str(), stof_version*()
 *   and stof_default_settings() are thread-safe. Tuning compiles its
 *   candidates on threads of its own (libuv threads, started and joined
 *   inside the planning call; not libuv's shared pool, so planning from
 *   a libuv pool thread is fine); GPU work stays on the calling thread. stof_attention_run() may be
 *   called from any thread once its plan exists, as long as the calls on one
 *   plan do not overlap with stof_plan_free() of that plan.
 * - GPU work uses the primary context of the chosen device, so pointers from
 *   PyTorch, cudaMalloc or cuMemAlloc work as they are. libcuda and libnvrtc
 *   are loaded at run time: without a GPU the library still opens, the mask
 *   and format calls work, and GPU calls return STOF_ERR_NO_DEVICE.
 *
 * Usage (error handling shortened):
 *
 *     stof_settings s;
 *     stof_default_settings(&s);
 *     stof_context *ctx;
 *     if (stof_open(&ctx, &s) != STOF_OK) { ... stof_errmsg(ctx) ...; }
 *
 *     stof_mask *m;
 *     stof_mask_from_spec(ctx, "sliding:256", 4096, 4096, &m);
 *
 *     stof_attention_desc d;
 *     stof_attention_desc_init(&d, 4, 16, 4096, 4096, 64, STOF_DTYPE_FP16,
 *                              STOF_LAYOUT_BHSD);
 *     stof_plan *p;
 *     stof_attention_plan(ctx, &d, m, &p);       // warm-up: tuned once,
 *                                                // then loaded from the
 *                                                // tuning database
 *     stof_attention_run(p, q, k, v, o, stream); // many times, async
 *
 *     stof_plan_free(&p);
 *     stof_mask_free(&m);
 *     stof_close(&ctx);
 */
#ifndef STOF_H
#define STOF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  define STOF_API __declspec(dllexport)
#elif defined(__GNUC__) && __GNUC__ >= 4
#  define STOF_API __attribute__((visibility("default")))
#else
#  define STOF_API
#endif

/* ------------------------------------------------------------------------ */
/* Versions                                                                  */
/* ------------------------------------------------------------------------ */

#define STOF_VERSION_MAJOR 0
#define STOF_VERSION_MINOR 2
#define STOF_VERSION_PATCH 0
#define STOF_VERSION_NUMBER \
    (STOF_VERSION_MAJOR * 10000 + STOF_VERSION_MINOR * 100 + STOF_VERSION_PATCH)

/* The version of the library actually linked, as a number built like
 * STOF_VERSION_NUMBER and as a static string "MAJOR.MINOR.PATCH". */
STOF_API unsigned stof_version(void);
STOF_API const char *stof_version_string(void);

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/* X(name, value, description). New codes are added at the end only. */
#define STOF_STATUS_MAP(X)                                                     \
    X(OK, 0, "success")                                                        \
    X(ERR_INVALID_ARGUMENT, 1, "invalid argument")                             \
    X(ERR_OUT_OF_MEMORY, 2, "out of memory (host or device)")                  \
    X(ERR_NO_DEVICE, 3, "no usable CUDA device or driver")                     \
    X(ERR_CUDA, 4, "CUDA driver error")                                        \
    X(ERR_NVRTC, 5, "NVRTC error (run-time compilation failed)")               \
    X(ERR_UNSUPPORTED, 6, "unsupported problem or configuration")              \
    X(ERR_DATABASE, 7, "tuning database error")                                \
    X(ERR_NOT_FOUND, 8, "not found")                                           \
    X(ERR_VERIFY, 9, "kernel output failed verification")                      \
    X(ERR_BUFFER_TOO_SMALL, 10, "caller buffer too small")                     \
    X(ERR_IO, 11, "input/output error")                                        \
    X(ERR_INTERNAL, 12, "internal error (a bug in stof)")

typedef enum stof_status {
#define STOF__STATUS_ENUM(name, value, text) STOF_##name = value,
    STOF_STATUS_MAP(STOF__STATUS_ENUM)
#undef STOF__STATUS_ENUM
    STOF_STATUS_COUNT_ /* not a status; one past the last */
} stof_status;

/* A static description of a status, e.g. "invalid argument". Never NULL;
 * unknown values give "unknown status". Thread-safe. */
STOF_API const char *stof_status_str(stof_status st);

/* The enumerator's name without the prefix, e.g. "ERR_INVALID_ARGUMENT". */
STOF_API const char *stof_status_name(stof_status st);

/* ------------------------------------------------------------------------ */
/* Context                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct stof_context stof_context;

typedef enum stof_log_level {
    STOF_LOG_ERROR = 0,
    STOF_LOG_WARN = 1,
    STOF_LOG_INFO = 2,
    STOF_LOG_DEBUG = 3
} stof_log_level;

/* Called synchronously on the thread that made the stof call. `msg` is valid
 * only during the call and has no trailing newline. */
typedef void (*stof_log_fn)(void *user, stof_log_level level, const char *msg);

typedef enum stof_tuning_mode {
    STOF_TUNE_DEFAULT = 0,  /* use the database; tune what is missing */
    STOF_TUNE_CACHE_ONLY = 1, /* never tune; fall back and record misses */
    STOF_TUNE_FORCE = 2     /* always re-tune, replacing stored records */
} stof_tuning_mode;

typedef struct stof_settings {
    int device;               /* CUDA device ordinal (default 0) */
    int require_device;       /* 1: stof_open fails with STOF_ERR_NO_DEVICE
                                 when no GPU is usable (default 0: open
                                 anyway, GPU calls fail later) */
    const char *user_db;      /* writable tuning DB path; NULL = default
                                 location (not used before the DB exists) */
    const char *const *system_dbs; /* NULL-terminated read-only DB paths */
    stof_tuning_mode tuning_mode;
    double tuning_budget_s;   /* per problem; 0 = no limit */
    int compile_threads;      /* 0 = number of cores */
    stof_log_fn log_fn;       /* NULL = no logging */
    void *log_user;           /* passed to log_fn */
    stof_log_level log_level; /* most verbose level passed to log_fn */
    int tuning_top_k;         /* stage 1 keeps this many candidates of each
                                 kernel kind for the timed stage (0 = 3) */
    int tuning_reps;          /* timed runs per candidate (0 = 15) */
    uint64_t tuning_seed;     /* seed of the verification inputs; the same
                                 seed gives the same inputs and candidate
                                 order (0 = the built-in seed) */
    uint8_t reserved[112];    /* must be zero (stof_default_settings does) */
} stof_settings;

/* Fill `s` with the defaults. Always call it before changing fields, so that
 * fields added in later versions get their defaults. Thread-safe. The
 * environment sets one default: $STOF_TUNING_MODE = default, cache-only
 * or force gives tuning_mode (a program that sets the field wins); any
 * other value makes stof_open fail with STOF_ERR_INVALID_ARGUMENT. */
STOF_API void stof_default_settings(stof_settings *s /* OUT */);

/* Open a context. On success *ctx is a new context. On failure *ctx is still
 * set when memory allowed it (so stof_errmsg(*ctx) explains the failure) and
 * must be closed; otherwise it is NULL. `s` may be NULL for the defaults. */
STOF_API stof_status stof_open(stof_context **ctx /* OUT */,
                               const stof_settings *s);

/* Close a context and set *ctx to NULL. Masks and plans made from it must be
 * freed first. stof_close(NULL) and closing a NULL *ctx are harmless. */
STOF_API void stof_close(stof_context **ctx);

/* The message of the last failed call on `ctx`; "" after a success. The text
 * is owned by the context and valid until its next call. NULL ctx gives a
 * static text. */
STOF_API const char *stof_errmsg(const stof_context *ctx);

/* The status of the last call on `ctx`. */
STOF_API stof_status stof_errcode(const stof_context *ctx);

/* 1 when the context has a usable GPU, else 0. */
STOF_API int stof_has_device(const stof_context *ctx);

/* Describe the device as JSON: name, compute capability, SM count, memory,
 * driver and NVRTC versions, the architecture code NVRTC targets.
 * Writes at most `n` bytes (always NUL-terminated when n > 0) and stores the
 * size needed, without the NUL, in *needed when it is not NULL.
 * STOF_ERR_BUFFER_TOO_SMALL when truncated; STOF_ERR_NO_DEVICE without GPU. */
STOF_API stof_status stof_device_describe(stof_context *ctx, char *buf,
                                          size_t n, size_t *needed /* OUT */);

/* The XXH3-64 hash of every embedded kernel template, as part of every cache
 * key. Thread-safe. */
STOF_API uint64_t stof_template_hash(void);

/* Load the kernels the tuning databases hold for this GPU (records of its
 * name, SM count, driver, NVRTC, stof and template versions) into the
 * context's module cache, the most used first, and keep the most used
 * records (64) in memory, read and checked, so that plans that hit the
 * database later neither load modules nor read records again (in a fresh
 * process a layer plan's module loads take 2-3 ms on an H200; the rest of
 * a warm plan under 1).
 * For a serving process: call it once after stof_open, before traffic.
 * When the databases hold cuBLASLt algorithms for this GPU, it starts
 * cuBLASLt too (~0.1 s the first time in a process). It runs no kernel;
 * records failing their integrity check are skipped, and a record this
 * host has not verified is still verified when a plan first uses it. Preloaded modules nobody uses are evicted first when the
 * cache (256 modules) fills. max_modules: at most this many modules and
 * records (0 = as many as the caches hold). *loaded (may be NULL): the
 * modules loaded by this
 * call (those the cache had already are not counted). STOF_OK with
 * *loaded = 0 without a database; STOF_ERR_NO_DEVICE without a GPU;
 * STOF_ERR_UNSUPPORTED when the driver cannot list a module's kernels
 * (before CUDA 12.4). A module that fails to load is logged and skipped.
 * $STOF_PRELOAD=1 (or all) makes stof_open call it once it has the GPU (a
 * failure is logged, the context opens), so that programs which do not
 * call it (the PyTorch operator, the transformers integration) preload
 * too; any value but 0, 1 or all makes stof_open fail with
 * STOF_ERR_INVALID_ARGUMENT. */
STOF_API stof_status stof_preload(stof_context *ctx, int max_modules,
                                  int *loaded /* OUT */);

/* ------------------------------------------------------------------------ */
/* Masks                                                                     */
/* ------------------------------------------------------------------------ */

/* A boolean seq_q x seq_k attention mask (1 = the query may attend to the
 * key), stored bit-packed. Immutable once made. */
typedef struct stof_mask stof_mask;

/* Make a mask from a spec. Positions are element indices, q = query row,
 * k = key column:
 *   dense                 every key
 *   causal                k <= q
 *   sliding:W             |q-k| < W
 *   causal_sliding:W      k <= q and q-k < W
 *   dilated:W:D           |q-k| < W and (q-k) % D == 0
 *   longformer:W:G        |q-k| < W or q < G or k < G
 *   bigbird:B:W:G:R:SEED  on B x B blocks (block row i, block column j):
 *                         i-(W-1)/2 <= j <= i+W/2 (W window blocks), or i < G
 *                         or j < G (global blocks), or one of R random
 *                         block columns drawn for row i from SEED
 *   strided:S             |q-k| < S or k % S == S-1
 *   random:P:SEED         each element kept with probability P (0..1)
 *   none                  no key at all (an empty mask)
 *   docs, prefix, prefix:P, bitmap, head_sliding, head_causal_sliding
 *                         the family leaves (see stof_mask_family); here
 *                         with the default data: one document over the
 *                         keys (a query row at or past seq_k is in no
 *                         document, so `docs` empties it), prefix 0,
 *                         every key, no window limit
 * combined with `!a` (negation), `a&b` (intersection, binds tighter than
 * union), `a|b` (union) and parentheses. Spaces are ignored. W, D, S, G, B must be positive integers
 * (G may be 0), R >= 0, SEED any unsigned 64-bit integer.
 * seq_q, seq_k: any sizes from 1 to 1048576 (2^20).
 * Errors: STOF_ERR_INVALID_ARGUMENT with a message naming the column of the
 * spec and what was expected. On failure *mask is NULL. */
STOF_API stof_status stof_mask_from_spec(stof_context *ctx, const char *spec,
                                         int seq_q, int seq_k,
                                         stof_mask **mask /* OUT */);

/* Make a mask from row-major bytes: element (q, k) is bytes[q*seq_k + k],
 * nonzero = allowed. The bytes are copied; the caller keeps them. */
STOF_API stof_status stof_mask_from_dense(stof_context *ctx,
                                          const uint8_t *bytes, int seq_q,
                                          int seq_k,
                                          stof_mask **mask /* OUT */);

/* Make a mask from packed bits: key k of row q is bit k % 8 (the least
 * significant first) of byte bits[q*row_bytes + k/8], the layout of
 * numpy's packbits(..., axis=1, bitorder="little") and 8x smaller than
 * stof_mask_from_dense's bytes. row_bytes >= ceil(seq_k / 8); the bits
 * past seq_k in a row's last byte, and any bytes after it, are ignored.
 * The bits are copied; the caller keeps them. */
STOF_API stof_status stof_mask_from_bits(stof_context *ctx,
                                         const uint8_t *bits, size_t row_bytes,
                                         int seq_q, int seq_k,
                                         stof_mask **mask /* OUT */);

/* Free a mask and set *mask to NULL; NULL is harmless. */
STOF_API void stof_mask_free(stof_mask **mask);

STOF_API int stof_mask_seq_q(const stof_mask *m);
STOF_API int stof_mask_seq_k(const stof_mask *m);
/* The number of allowed elements. */
STOF_API uint64_t stof_mask_count(const stof_mask *m);
/* count / (seq_q * seq_k). */
STOF_API double stof_mask_density(const stof_mask *m);
/* 1 if (q, k) is allowed, 0 if not or out of range. */
STOF_API int stof_mask_get(const stof_mask *m, int q, int k);

/* XXH3-128 over the canonical bit-packed mask and its dimensions, as two
 * 64-bit halves (high first) and as 32 lowercase hex digits + NUL. Two masks
 * have the same digest exactly when they are equal (up to hash collisions).
 * Either out-pointer may be NULL. */
STOF_API void stof_mask_digest(const stof_mask *m, uint64_t digest[2] /* OUT */,
                               char hex[33] /* OUT */);

/* Unpack into row-major bytes (0/1), seq_q*seq_k bytes, caller-owned. */
STOF_API void stof_mask_to_dense(const stof_mask *m, uint8_t *bytes /* OUT */);

/* A picture of m as an 8-bit RGB PNG file's bytes: keys left to right,
 * queries top to bottom, in block_m x block_n tiles (0: 128 x 128) coloured
 * as the sparse formats see them: full tiles blue, partial tiles orange
 * (each pixel darker the more of its elements are allowed: the square
 * root of the share, so that sparse pixels show), empty tiles
 * white, tile lines grey when a tile spans 4 pixels or more. At most
 * max_side pixels a side (0: 1024; 16..8192): each pixel then covers s x s
 * elements. At most 2^24 tiles (STOF_ERR_INVALID_ARGUMENT beyond: larger
 * tiles). Size-then-fetch: *size gets the bytes needed;
 * STOF_ERR_BUFFER_TOO_SMALL (no message when buf is NULL and cap 0) when
 * cap is smaller. */
STOF_API stof_status stof_mask_png(stof_context *ctx, const stof_mask *m,
                                   int block_m, int block_n, int max_side,
                                   unsigned char *buf, size_t cap,
                                   size_t *size /* OUT */);

/* ------------------------------------------------------------------------ */
/* Sparse formats                                                            */
/* ------------------------------------------------------------------------ */

typedef enum stof_tile_kind {
    STOF_TILE_EMPTY = 0,
    STOF_TILE_PARTIAL = 1,
    STOF_TILE_FULL = 2
} stof_tile_kind;

/* The formats the kernels consume, built from a mask for a BM x BN tiling.
 * All arrays are owned by the format and freed by stof_format_free().
 *
 * Block-wise (tile-level BSR): query row-block i (rows i*BM .. i*BM+BM-1,
 * clipped at seq_q) has non-empty tiles at entries row_ptr[i] ..
 * row_ptr[i+1]-1 of col_idx (key block index, ascending) and kind
 * (STOF_TILE_FULL or STOF_TILE_PARTIAL). For a partial tile, bitmap_idx[e]
 * is its index among partial tiles and its bitmap is the BM rows of
 * bitmap_words_per_row 32-bit words at bitmaps + bitmap_idx[e] * BM *
 * bitmap_words_per_row; bit (r, c) is word c/32, bit c%32 of row r. For a
 * full tile bitmap_idx[e] is -1. A tile is full when every element inside
 * the matrix is allowed: the parts of an edge tile beyond seq_q or seq_k do
 * not count (they are always 0 in bitmaps).
 *
 * Row-wise: query row-block i uses the keys rw_keys[rw_ptr[i] ..
 * rw_ptr[i+1]-1] (ascending; a key is listed when any row of the block
 * allows it). Its bitmap has BM rows of rw_words[i] 32-bit words starting at
 * rw_bitmaps + rw_bitmap_off[i]; bit (r, j) says whether row r allows the
 * j-th listed key. */
typedef struct stof_format {
    int seq_q, seq_k, block_m, block_n;
    int n_row_blocks, n_col_blocks;
    /* block-wise */
    int64_t n_full, n_partial, n_empty; /* tile counts */
    int64_t *row_ptr;    /* n_row_blocks + 1 */
    int32_t *col_idx;    /* row_ptr[n_row_blocks] */
    uint8_t *kind;       /* row_ptr[n_row_blocks] */
    int32_t *bitmap_idx; /* row_ptr[n_row_blocks] */
    int bitmap_words_per_row;
    uint32_t *bitmaps;   /* n_partial * block_m * bitmap_words_per_row */
    /* row-wise */
    int64_t *rw_ptr;        /* n_row_blocks + 1 */
    int32_t *rw_keys;       /* rw_ptr[n_row_blocks] */
    int32_t *rw_words;      /* n_row_blocks: 32-bit words per bitmap row */
    int64_t *rw_bitmap_off; /* n_row_blocks + 1, in words */
    uint32_t *rw_bitmaps;   /* rw_bitmap_off[n_row_blocks] words */
    /* statistics */
    uint64_t allowed;       /* allowed elements of the mask */
    double partial_fill;    /* allowed elements inside partial tiles over
                               their in-matrix area; 0 if none */
    double rowwise_fill;    /* allowed / sum over blocks of (rows * keys) */
    uint8_t reserved[64];
} stof_format;

/* Build every format for a BM x BN tiling. block_m and block_n: powers of
 * two from 16 to 256. The result is owned by the caller: free it with
 * stof_format_free(). */
STOF_API stof_status stof_format_build(stof_context *ctx, const stof_mask *m,
                                       int block_m, int block_n,
                                       stof_format **fmt /* OUT */);

STOF_API void stof_format_free(stof_format **fmt);

/* ------------------------------------------------------------------------ */
/* Mask families                                                             */
/* ------------------------------------------------------------------------ */

/* A mask family: a spec whose instances take data that may change on every
 * call (sequence lengths, documents, prefixes, query offsets, seeds) without
 * a new family. The spec grammar is stof_mask_from_spec's, with these
 * forms:
 *   docs       the key is in the query's document (doc_id below)
 *   prefix     k < the sequence's prefix length (prefix below)
 *   prefix:P   k < P
 *   bitmap     the instance's own bitmap (bitmap below): any pattern
 *              the grammar cannot say, given per sequence on the device
 *   head_sliding, head_causal_sliding  sliding:W and causal_sliding:W
 *              with W of the head (head_window below): a window per head,
 *              so a plan's formats are built per sequence and head
 *   !a         negation (binds tightest: !causal&sliding:8 is
 *              (!causal)&sliding:8)
 * so a prefix-LM is "causal|prefix", packed documents "causal&docs".
 * Sequence b of an instance is a seq_q x seq_k mask whose query rows past
 * q_len[b] and keys past k_len[b] are padding (never allowed; their K and
 * V rows may hold anything, NaN and Inf included, e.g. a cache's unwritten
 * slots: they never reach the output). Query row q of sequence b
 * sits at key position p = q + q_offset[b], and every leaf reads p where
 * the spec says q (so q_offset[b] = k_len[b] - q_len[b] makes `causal`
 * bottom-right aligned, for a chunk of queries at the end of the keys). A
 * family is immutable and may be shared by threads. */
typedef struct stof_mask_family stof_mask_family;

STOF_API stof_status stof_mask_family_create(stof_context *ctx,
                                             const char *spec,
                                             stof_mask_family **fam /* OUT */);
STOF_API void stof_mask_family_free(stof_mask_family **fam);
/* The canonical spec of the family (spaces removed, numbers as read):
 * families with equal canonical specs are equal. Owned by the family. */
STOF_API const char *stof_mask_family_spec(const stof_mask_family *fam);

/* The instance data of a batch of sequences, each array indexed by the
 * sequence b (NULL = the default for every sequence). Zero-initialise it
 * and set what the family uses. */
typedef struct stof_mask_data {
    const int32_t *q_len;    /* query rows, 0..seq_q (default seq_q) */
    const int32_t *k_len;    /* keys, 0..seq_k (default seq_k) */
    const int32_t *q_offset; /* key position of query row 0, 0..2^30
                                (default 0) */
    const int32_t *prefix;   /* `prefix` keeps k < prefix[b], >= 0
                                (default 0) */
    const int32_t *doc_id;   /* document of key position k of sequence b at
                                doc_id[b * doc_stride + k], non-decreasing
                                over k < k_len[b] (default: one document);
                                a query at a position >= k_len[b] is in no
                                document */
    int64_t doc_stride;      /* 0 = seq_k; else >= seq_k */
    const uint64_t *seed;    /* mixed into the SEED of random and bigbird
                                (default 0: the spec's SEED as is) */
    /* The packed layout (STOF_LAYOUT_PACKED; NULL otherwise): sequence b
     * is rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q and o and
     * keys cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1 of k and v (batch + 1
     * non-decreasing offsets, the first >= 0, usually 0; rows before it
     * belong to no sequence; NULL cu_seqlens_k = cu_seqlens_q). K and V
     * rows after the last sequence's keys may hold anything (NaN and Inf
     * too: they never reach the output); rows before cu_seqlens_k[0]
     * must be finite.
     * Its lengths are these (q_len and k_len must be NULL) and its doc_id
     * of key k is doc_id[cu_seqlens_k[b] + k] (doc_stride unused). */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    int32_t total_q, total_k; /* packed runs: the rows of q/o and of k/v
                                 this call (host values; 0 = seq_q, seq_k;
                                 at most those); rows past the last
                                 sequence are zeros */
    /* `bitmap`: query row q of sequence b may see key k when bit k % 32 of
     * bitmap[b * bitmap_stride + q * bitmap_words + k / 32] is set (rows
     * and keys of the sequence, not positions: q_offset does not move
     * it). NULL: every key. A sequence's bitmap holds seq_q rows (packed:
     * its own rows). */
    const uint32_t *bitmap;
    int64_t bitmap_stride;   /* 32-bit words between sequences' bitmaps;
                                0 = one bitmap for every sequence */
    int32_t bitmap_words;    /* words per row: 0 = ceil(seq_k / 32), else
                                at least that */
    int32_t head;            /* host functions (stof_mask_family_eval,
                                stof_format_build_family, data checks):
                                the head whose head_window the head_*
                                leaves read; plans and runs do every head */
    const int32_t *head_window; /* per head h (the plan's heads): the W of
                                   head_sliding and head_causal_sliding,
                                   >= 0 (default: no limit) */
    uint8_t reserved[8];     /* must be zero */
} stof_mask_data;

/* Check host instance data for `batch` sequences of at most seq_q x seq_k
 * (data may be NULL: every default). Errors: STOF_ERR_INVALID_ARGUMENT
 * naming the sequence, the field and the value (a length out of range, a
 * negative offset or prefix, document ids that decrease, a doc_stride
 * below seq_k, reserved bytes set). */
STOF_API stof_status stof_mask_data_check(stof_context *ctx,
                                          const stof_mask_family *fam,
                                          int batch, int seq_q, int seq_k,
                                          const stof_mask_data *data);

/* The seq_q x seq_k mask of sequence b (host data, checked for b; seq_q and
 * seq_k at least 1). */
STOF_API stof_status stof_mask_family_eval(stof_context *ctx,
                                           const stof_mask_family *fam,
                                           int seq_q, int seq_k,
                                           const stof_mask_data *data, int b,
                                           stof_mask **mask /* OUT */);

/* The formats of sequence b (host data, checked for b), equal to
 * stof_format_build of stof_mask_family_eval's mask, built tile by tile
 * from the family's structure without a bit matrix: the block part's time
 * and memory follow the non-empty tiles (plus block_m x seq_k / 8 bytes of
 * scratch), not seq_q x seq_k; the row-wise part (key lists and their
 * bitmaps) follows the allowed elements, so a causal mask of 2^20 keys
 * needs tens of GB (STOF_ERR_OUT_OF_MEMORY where they cannot be had). */
STOF_API stof_status stof_format_build_family(stof_context *ctx,
                                              const stof_mask_family *fam,
                                              int seq_q, int seq_k,
                                              const stof_mask_data *data,
                                              int b, int block_m, int block_n,
                                              stof_format **fmt /* OUT */);

/* ------------------------------------------------------------------------ */
/* Attention                                                                 */
/* ------------------------------------------------------------------------ */

typedef enum stof_dtype {
    STOF_DTYPE_FP16 = 0,
    STOF_DTYPE_BF16 = 1
} stof_dtype;

typedef enum stof_layout {
    STOF_LAYOUT_BHSD = 0,   /* [batch][heads][seq][head_dim] contiguous */
    STOF_LAYOUT_BSHD = 1,   /* [batch][seq][heads][head_dim] contiguous */
    STOF_LAYOUT_STRIDED = 2, /* the *_stride fields say (head_dim must be
                                contiguous) */
    STOF_LAYOUT_PACKED = 3   /* [total][heads][head_dim]: the batch's
                                sequences one after another, where
                                stof_mask_data's cu_seqlens_q/k say (mask
                                family plans only); seq_q and seq_k are the
                                most rows of q/o and of k/v; strides
                                {ignored, head, row}, set by
                                stof_attention_desc_init and honoured as
                                given (a slice of a packed qkv tensor) */
} stof_layout;

/* One attention problem: O = softmax(scale * Q K^T + mask) V per batch and
 * head, with the same mask for every batch and head. A query row whose mask
 * row allows no key produces a row of zeros (not NaN).
 * Strides are in elements, in the order {batch, head, seq}.
 * Sizes: batch 1..65535, heads 1..4096 (batch * heads * ceil(seq_q / 4) at
 * most 2^31 - 1: one launch's CTAs; a mask family whose windows depend on
 * the head, batch * heads at most 65535), seq_q
 * and seq_k at least 1 (a mask's at most 2^20), head_dim a multiple of 8 in
 * 16..256. scale, softcap and the ALiBi slopes must stay finite once
 * multiplied by log2(e) (and scale / softcap too): the kernels work in
 * base 2. */
typedef struct stof_attention_desc {
    int batch, heads, seq_q, seq_k, head_dim;
    stof_dtype dtype;
    float scale;          /* 0 means 1/sqrt(head_dim) */
    stof_layout layout;
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
    int kv_heads;         /* grouped-query attention: K and V have kv_heads
                             heads (dividing heads; 1 = multi-query), query
                             head h reads K/V head h / (heads / kv_heads);
                             0 = heads. Set it after
                             stof_attention_desc_init: BHSD, BSHD and packed
                             strides of k and v (as desc_init set them) are
                             then taken with kv_heads heads; strides set by
                             the caller are used as given */
    float softcap;        /* logit soft-capping (Gemma 2): 0 = none; > 0:
                             every score s = scale * q.k becomes
                             softcap * tanh(s / softcap) */
    const float *alibi_slopes; /* ALiBi: NULL = none; else `heads` finite
                             slopes in host memory, copied by the plan:
                             head h's scores get slope[h] * (k - q), k and
                             q the key's and the query's row in the
                             tensors (a row's constant does not change O;
                             the log-sum-exp output includes it). Not
                             with the packed layout. Applied after the
                             soft-cap */
    int64_t bias_stride[3]; /* additive bias (bias = 1): the strides, in
                             elements, {batch, head, query row} of the
                             bias tensor given to each run
                             (stof_attention_run_ex): element (b, h, i,
                             j) at b * bias_stride[0] + h * bias_stride[1]
                             + i * bias_stride[2] + j, in desc.dtype; 0
                             broadcasts along that dimension (e.g. {0, S_q
                             * S_k, S_k}: one bias per head for every
                             batch element); each a multiple of 8 */
    int bias;             /* 1: every score gets the bias tensor's element
                             added (after the soft-cap and ALiBi; a -inf
                             element masks its key, as the mask does, and
                             so does a bf16 value so negative that it
                             overflows fp32 once scaled by log2(e) or 1 /
                             scale (e.g. torch.finfo(bfloat16).min); +inf
                             and NaN are not allowed); 0: none. Head h is
                             the query head. Not with the packed layout */
    uint8_t reserved[20]; /* must be zero */
} stof_attention_desc;

/* Fill a descriptor, with the strides of `layout` (BHSD or BSHD) and the
 * default scale. Returns STOF_ERR_INVALID_ARGUMENT for a bad layout, a size
 * below 1, or sizes whose strides would not fit 64 bits (the sizes are
 * still stored, so stof_attention_plan names the bad field). */
STOF_API stof_status stof_attention_desc_init(stof_attention_desc *d /* OUT */,
                                              int batch, int heads, int seq_q,
                                              int seq_k, int head_dim,
                                              stof_dtype dtype,
                                              stof_layout layout);

typedef struct stof_plan stof_plan;

/* The warm-up: validate the problem, look it up in the tuning database
 * (user database, then the system databases) and load the stored kernel
 * without compiling anything; on a miss, tune it (stage 1: the cost model
 * ranks every kernel configuration; stage 2: the best few of each kind
 * are compiled in parallel, checked against the reference kernel on random
 * inputs and timed, and the fastest is stored), or, in
 * STOF_TUNE_CACHE_ONLY mode, use the cost model's choice and record the
 * miss for `stof-tune pending`. stof_plan_describe says which happened.
 * A record that this host did not tune itself (from a system database, an
 * import or a merge) is checked the first time it is used here: its
 * kernel runs once on random inputs against the reference kernel (tens of
 * milliseconds; "verify_ms" in the description), and only a record that
 * passes is used, and remembered as trusted in the user database; a record
 * that fails, or whose content hash does not match, is ignored (logged)
 * and the problem is planned as a miss. The key does not depend on the
 * layout or strides: a record serves every layout. The plan copies what it
 * needs from `d` and `m`; both may be freed afterwards.
 * head_dim: 16..256, a multiple of 8. Device pointers passed to
 * stof_attention_run must be 16-byte aligned, and every stride a multiple of
 * 8 elements.
 * Errors: STOF_ERR_INVALID_ARGUMENT (bad descriptor, or the mask's sizes
 * differ from seq_q/seq_k), STOF_ERR_NO_DEVICE, STOF_ERR_NVRTC, STOF_ERR_CUDA.
 */
STOF_API stof_status stof_attention_plan(stof_context *ctx,
                                         const stof_attention_desc *d,
                                         const stof_mask *m,
                                         stof_plan **plan /* OUT */);

/* The batch warm-up: plan n problems (descs[i] with masks[i]) at once.
 * Database hits load as in stof_attention_plan; the misses are tuned
 * together, with every distinct kernel of all their candidates compiled
 * once, in one parallel pool. plans[i] is set for each problem that
 * succeeded and NULL for the others. Returns STOF_OK when all succeeded,
 * else the status of the first failure, whose message names its index.
 * Callers own every plan (stof_plan_free). */
STOF_API stof_status stof_attention_plan_batch(stof_context *ctx, int n,
                                               const stof_attention_desc *descs,
                                               const stof_mask *const *masks,
                                               stof_plan **plans /* OUT */);

/* Enqueue the attention on `stream` (CUstream / cudaStream_t; NULL = the
 * legacy default stream). q, k, v: inputs, o: output, device pointers laid
 * out as the plan's descriptor says. Returns after enqueueing; errors of
 * the launch itself are reported, errors during execution surface at the
 * caller's next synchronisation. Thread-safe for distinct plans. A plan
 * whose kernel is split over the keys ("SPLITS" in stof_plan_describe:
 * short queries against long keys) keeps its partial results in the plan
 * between its two kernels, so its runs, like a family plan's, must be
 * ordered (one stream, or synchronised between streams). */
STOF_API stof_status stof_attention_run(stof_plan *plan, const void *q,
                                        const void *k, const void *v, void *o,
                                        void *stream);

/* The warm-up of attention over a mask family: every run then takes its
 * own instance data (stof_attention_run_family) and the plan builds that
 * instance's formats on the GPU, on the run's stream, before the attention
 * kernel: nothing is tuned, compiled, allocated or synchronised per run, so
 * a run can be captured in a CUDA graph. d: the largest batch and lengths
 * (each sequence is padded to seq_q x seq_k in q, k, v and o, as in
 * stof_attention_plan). The kernel is chosen (database, tuning or cost
 * model, as stof_attention_plan does) on the `sample` instance (host data,
 * checked; NULL = the default instance) among the block-format kernels.
 * No seq_q x seq_k bit matrix is made anywhere: the statistics of the key
 * come from the GPU builder, the cost model ranks the kernels on the tile
 * counts of sequence 0 built on the GPU at each tiling, and the search
 * verifies
 * against a reference kernel that evaluates the family on the GPU (the
 * first head of every sequence) with inputs made on the GPU, so host
 * memory follows the tiles, not the elements: lengths go up to 2^20 each
 * (1048576, packed totals included), as for any mask. Its database key is the
 * family's, not the sample's bits: the canonical spec; batch, heads,
 * head_dim, dtype, device and versions as for any problem; seq_q and seq_k
 * each rounded up to the next of 128, 192, 256, 384, 512, 768, 1024,
 * 1536, ... (2^j and 3 * 2^(j-1)), so lengths within a factor 1.5 share a
 * record; and buckets (steps of a factor sqrt(2)) of the sample's
 * statistics on 128 x 64 tiles over the batch: non-empty over all tiles,
 * partial over non-empty, most tiles of a row block over the key blocks.
 * A plan whose key is stored loads its kernel without compiling it (the
 * GPU format builder is compiled once per context). The plan's device
 * workspace holds about 14 bytes per tile of the batch and the bitmaps of
 * the most partial tiles the family can have (every tile for strided,
 * docs, bigbird and dilated leaves). The tiles of the batch (batch x
 * ceil(seq_q / 128) x ceil(seq_k / 64), times heads with head_* leaves, and
 * at the chosen kernel's tiling too) must number at most 2^31 - 1
 * (STOF_ERR_UNSUPPORTED beyond: e.g. at 2^20 tokens a batch of at most 15
 * sequences). Families with random leaves, or
 * bigbird with more than 64 random blocks a row, are not built on the GPU
 * (STOF_ERR_UNSUPPORTED: use stof_mask_from_spec).
 * The packed layout (d->layout STOF_LAYOUT_PACKED): d->batch sequences
 * packed one after another in [total][heads][head_dim] tensors of at most
 * d->seq_q query and d->seq_k key rows, each sequence where a run's
 * cu_seqlens_q / cu_seqlens_k say; the sample must give them (host). The
 * kernels run over the packed rows as one sequence whose format holds
 * every sequence's mask on its diagonal block (tiles across sequence
 * boundaries are partial, tiles between sequences empty), so the key is
 * the family's with the packed lengths bucketed, batch 1, and "packed". */
STOF_API stof_status stof_attention_plan_family(stof_context *ctx,
                                                const stof_attention_desc *d,
                                                const stof_mask_family *fam,
                                                const stof_mask_data *sample,
                                                stof_plan **plan /* OUT */);

/* Enqueue attention with this call's instance data: `data` holds device
 * pointers (int32 arrays of the plan's batch, doc_id of batch * doc_stride;
 * NULL fields and data NULL = the defaults). Device data is clamped, not
 * checked: lengths to 0..seq_q / seq_k, offsets and prefixes to 0..2^30;
 * document ids that decrease are compared element by element (right,
 * slower); packed offsets to 0..total and each to at least the one before
 * (a sequence never starts before its predecessor ends). Output rows past
 * q_len[b] are zeros, and, packed, rows outside every sequence. A packed
 * plan's run needs cu_seqlens_q (and total_q / total_k when its tensors
 * hold fewer rows than the plan's seq_q / seq_k: the kernels then read and
 * write those rows only). stof_attention_run on a family plan runs the
 * default instance (not for packed plans). Each run rewrites the plan's
 * format workspace: runs of one plan must be ordered (one stream, or
 * synchronised between streams); distinct plans are independent. */
STOF_API stof_status stof_attention_run_family(stof_plan *plan,
                                               const stof_mask_data *data,
                                               const void *q, const void *k,
                                               const void *v, void *o,
                                               void *stream);

/* stof_attention_run (data NULL) or stof_attention_run_family (data: the
 * instance, as there) that also writes each query row's log-sum-exp, the
 * natural log of the sum of exp(scale * q.k) over the row's allowed keys
 * (-inf for a row with none), to lse: device memory, fp32, 4-byte
 * aligned, [batch][heads][seq_q] (packed plans: [heads][total_q]), so
 * that results over key ranges computed apart (split-KV, chunked prefill)
 * can be merged. Errors as those functions, and STOF_ERR_INVALID_ARGUMENT
 * for lse NULL or misaligned. */
STOF_API stof_status stof_attention_run_lse(stof_plan *plan,
                                            const stof_mask_data *data,
                                            const void *q, const void *k,
                                            const void *v, void *o, float *lse,
                                            void *stream);

/* One run's tensors and options (stof_attention_run_ex). Zero it, then
 * set what the run needs. */
typedef struct stof_run_args {
    const void *q, *k, *v; /* inputs, as for stof_attention_run */
    void *o;               /* output */
    const stof_mask_data *data; /* plans of stof_attention_plan_family:
                              the instance (NULL = the default instance);
                              NULL for other plans */
    float *lse;            /* NULL, or the log-sum-exp output, as
                              stof_attention_run_lse writes it */
    const void *bias;      /* plans whose descriptor has bias = 1: the
                              bias tensor (device memory, desc.dtype,
                              16-byte aligned, laid out as
                              desc.bias_stride says); NULL otherwise */
    uint32_t flags;        /* STOF_RUN_* bits; 0 = none */
    uint32_t reserved_u;   /* must be 0 */
    void *reserved[4];     /* must be NULL */
} stof_run_args;

/* stof_run_args.flags: this family run's instance data are the previous
 * run's of this plan: the same device arrays (the same stof_mask_data:
 * every pointer and value equal) with the same contents, that run ordered
 * before this one (one stream). The format that run built on the GPU is
 * used again instead of being rebuilt: the layers of a model share one
 * mask and one plan, and only the first builds. The format is built as
 * usual where the plan has built none yet, where data differ, and across
 * CUDA-graph capture: a captured run reuses only a build captured before
 * it, and once a plan has built a format in a capture its eager runs
 * always build (a replay rewrites the format unseen). Equal contents are
 * the caller's promise (the arrays are not read on the host). */
#define STOF_RUN_SAME_DATA 1u

/* The general run: stof_attention_run, stof_attention_run_family and
 * stof_attention_run_lse are this with some fields left NULL; a plan made
 * with an additive bias (desc.bias = 1) runs only through it. Errors as
 * those functions, and STOF_ERR_INVALID_ARGUMENT for a missing or
 * misaligned bias, a bias given to a plan without one, or reserved fields
 * set. */
STOF_API stof_status stof_attention_run_ex(stof_plan *plan,
                                           const stof_run_args *args,
                                           void *stream);

/* JSON description of a plan: kernel kind and parameters, where it came
 * from, measured time if any. Size-then-fetch like stof_device_describe. */
STOF_API stof_status stof_plan_describe(const stof_plan *plan, char *buf,
                                        size_t n, size_t *needed /* OUT */);

/* The message of the last failed stof_attention_run on this plan (runs may
 * happen on threads other than the context's). */
STOF_API const char *stof_plan_errmsg(const stof_plan *plan);

/* Free a plan (its device memory and module; a module or block format the
 * context shares between plans goes back to the context, which frees it at
 * stof_close or when it needs the room) and set *plan to NULL. The caller
 * must make sure no enqueued run still uses it (synchronise first). */
STOF_API void stof_plan_free(stof_plan **plan);


/* ------------------------------------------------------------------------ */
/* Transformer layers: the chain after (and around) attention, fused.      */
/* ------------------------------------------------------------------------ */

/* The FFN's activation. GELU_TANH is the tanh approximation (GPT-2,
 * PyTorch gelu(approximate="tanh")); GELU_ERF the exact one (BERT). */
typedef enum stof_activation {
    STOF_ACT_NONE = 0,
    STOF_ACT_GELU_TANH = 1,
    STOF_ACT_GELU_ERF = 2,
    STOF_ACT_RELU = 3,
    STOF_ACT_SILU = 4
} stof_activation;

typedef enum stof_norm_kind {
    STOF_NORM_LAYER = 0, /* (v - mean) / sqrt(var + eps) * gamma + beta */
    STOF_NORM_RMS = 1    /* v / sqrt(mean(v^2) + eps) * gamma (no beta) */
} stof_norm_kind;

/* One encoder layer over `batch` sequences of `seq` tokens, hidden size
 * `hidden` (= heads * head_dim unless desc.head_dim says otherwise;
 * head_dim and the mask decide the attention kernels), FFN size `ffn`.
 * Tensors are row-major [tokens][...] with tokens = batch * seq, in
 * `dtype`; accumulation is in fp32.
 *   post-norm (BERT):   h = norm1(x + attn(x) Wo^T + bo)
 *                       y = norm2(h + ffn(h))
 *   pre-norm (GPT-2, ViT): h = x + attn(norm1(x)) Wo^T + bo
 *                       y = h + ffn(norm2(h))
 * with attn the masked multi-head attention of the QKV projection
 * x Wqkv^T + bqkv (1/sqrt(head_dim) scale; with RoPE, Q and K rotated by
 * their positions first, and with qk_norm each Q and K head RMS-normalised
 * before that) and
 * ffn(u) = act(u W1^T + b1) W2^T + b2.
 * Sizes: tokens at most 2^30; hidden a multiple of 8 in 8..16384; ffn a
 * multiple of 8 in 8..131072 (65536 gated); head_dim = hidden / heads (or
 * desc.head_dim) a multiple of 8 in 16..256; batch and heads as
 * stof_attention_desc allows. */
typedef struct stof_layer_desc {
    int batch, seq;
    int hidden, heads, ffn;
    stof_dtype dtype;
    stof_activation act;
    stof_norm_kind norm;
    int pre_norm;         /* 0: post-norm, 1: pre-norm */
    float norm_eps;       /* 0 means 1e-5 */
    int kv_heads;         /* grouped-query attention: K and V have kv_heads
                             heads (dividing heads; 0 = heads), so the QKV
                             projection makes heads * head_dim + 2 *
                             kv_heads * head_dim columns
                             (stof_layer_weights) and
                             each K/V head serves heads / kv_heads query
                             heads */
    int no_bias;          /* 1: the projections have no biases (Llama-
                             style layers): b_qkv, b_o, b_ffn1 and b_ffn2
                             must be NULL; 0: all four are required */
    int gated;            /* 1: a gated FFN (SwiGLU with STOF_ACT_SILU,
                             GeGLU with a GELU): the first projection
                             makes 2 ffn columns, a gate g and an up
                             projection u, and the FFN is
                             w_ffn2 (act(g) * u) (stof_layer_weights);
                             0: w_ffn2 act(x w_ffn1^T) */
    float rope_theta;     /* rotary position embeddings (RoPE) on Q and K,
                             in the rotate-half form of Llama, GPT-NeoX
                             and Hugging Face's default rope type: 0 =
                             none (or rope_freq's), else the base (Llama
                             2: 10000, Llama 3: 500000; finite and > 1).
                             The token at position p of its sequence
                             (token b * seq + p) rotates the channel pairs
                             (i, i + rope_dim / 2), i < rope_dim / 2, of
                             each Q and K head
                             by the fp32 angle p * f_i, f_i = theta^(-2 i /
                             rope_dim) in fp32 (Hugging Face's inv_freq;
                             libm's powf may differ from torch's by an
                             ulp). Scaled rope types (Hugging Face's
                             rope_scaling: llama3, linear, yarn, longrope,
                             dynamic) give their frequencies in rope_freq
                             instead, with rope_theta 0. The rotation is
                             of the projection plus its bias in fp32
                             before its rounding to the dtype
                             where the QKV GEMM fuses it (the Hopper
                             template), else of the rounded projection (a
                             kernel after it); V is not rotated */
    int rope_dim;         /* the channels of each head that rotate (the
                             first rope_dim; GPT-NeoX's partial rotary):
                             0 = head_dim; else a multiple of 4 that is
                             at most head_dim (the Hopper GEMM's epilogue
                             rotates multiples of 16; others, e.g. GPT-NeoX
                             20B's 24, run the rope kernel after it). Only
                             with RoPE (rope_theta or rope_freq) */
    float rope_scale;     /* RoPE's cos and sin multiplied by it, in fp32
                             (Hugging Face's attention_scaling: yarn,
                             longrope): 0 = 1; else in (0, 16]. Only
                             with RoPE */
    const float *rope_freq; /* RoPE with frequencies given instead of a
                             base (rope_theta 0): rope_dim / 2 (head_dim /
                             2 for rope_dim 0) finite values >= 0 on the
                             host (each angle (seq - 1) f_i finite in
                             fp32 too), f_i of pair i, e.g. Hugging Face's
                             rotary_emb.inv_freq for any rope type (the
                             one of this seq for dynamic and longrope);
                             read by the plan, not kept. NULL: theta's
                             (or no RoPE). A tuned scheme does not depend
                             on the frequencies or rope_scale: one
                             database record serves every table of its
                             rope_dim (keys name "rope=table") */
    int qk_norm;          /* 1: Q and K normalised per head before RoPE
                             (Qwen3's q_norm and k_norm: the weight
                             multiplies; a model whose norm multiplies
                             by 1 + weight passes 1 + weight), each
                             head's head_dim values by RMSNorm with eps
                             norm_eps and a weight of head_dim shared by
                             the heads (Q's and K's own), in fp32 on the
                             rounded projection, then rotated and rounded
                             once; the weights follow w_qkv's rows
                             (stof_layer_weights). The QKV GEMM then runs
                             plain and a kernel after it normalises and
                             rotates. 0: none */
    int head_dim;         /* 0: hidden / heads (heads dividing hidden);
                             else each head's size, a multiple of 8 in
                             16..256, with heads * head_dim (at most
                             32768) the attention's width, which need not
                             be hidden (Qwen3 0.6B: hidden 1024, 16 heads
                             of 128; Qwen3 4B: 2560, 32 of 128): the QKV
                             projection makes
                             heads * head_dim + 2 kvd columns and the
                             output projection takes heads * head_dim */
    uint8_t reserved[24]; /* must be zero */
} stof_layer_desc;

/* Fill a descriptor with defaults: GELU (tanh), LayerNorm, post-norm,
 * eps 1e-5, ffn = 4 * hidden. */
STOF_API stof_status stof_layer_desc_init(stof_layer_desc *d /* OUT */,
                                          int batch, int seq, int hidden,
                                          int heads, stof_dtype dtype);

/* A layer's weights: device pointers in the descriptor's dtype, laid out
 * like PyTorch's nn.Linear (weight [out][in], row-major). w_qkv stacks the
 * Q, K and V projections: rows [0, qd) make Q, [qd, qd + kvd) K, [qd +
 * kvd, qd + 2 kvd) V, qd = heads * head_dim (hidden unless desc.head_dim
 * says otherwise), kvd = kv_heads * head_dim (qd without grouped-query
 * attention: 3 qd rows in all); head h uses columns [h*head_dim,
 * (h+1)*head_dim) of each; w_o is [hidden][qd]. With desc.gated, w_ffn1 is
 * [2 ffn][hidden]: rows [0, ffn) the gate, [ffn, 2 ffn) the up projection
 * (Llama's gate_proj and up_proj stacked), b_ffn1 [2 ffn] likewise. With
 * desc.qk_norm, w_qkv's buffer holds after its (qd + 2 kvd) rows the
 * Q norm's weight [head_dim], then the K norm's [head_dim] (Qwen3's
 * q_norm.weight and k_norm.weight). Every
 * pointer is required
 * (norm beta: only for LayerNorm; the four biases: not with desc.no_bias,
 * which wants them NULL) and must be 16-byte aligned. */
typedef struct stof_layer_weights {
    const void *w_qkv, *b_qkv;     /* [qd + 2 kvd][hidden] (then 2
                                      head_dim with qk_norm), [qd + 2 kvd] */
    const void *w_o, *b_o;         /* [hidden][qd], [hidden] */
    const void *w_ffn1, *b_ffn1;   /* [ffn][hidden], [ffn] (gated: 2 ffn) */
    const void *w_ffn2, *b_ffn2;   /* [hidden][ffn], [hidden] */
    const void *norm1_gamma, *norm1_beta; /* [hidden] */
    const void *norm2_gamma, *norm2_beta; /* [hidden] */
} stof_layer_weights;

typedef struct stof_layer stof_layer; /* a planned layer */

/* The layer warm-up. Plans the attention (stof_attention_plan, with the
 * QKV projection's output read in place through strides), then chooses a
 * fusion scheme: how the chain is cut into kernels (e.g. the output
 * projection with bias and residual in its epilogue followed by a
 * bias+residual+norm kernel, or one GEMM whose tiles hold whole rows and
 * normalise them) and, for every GEMM, the kernel (stof's templates or
 * cuBLASLt when it can be loaded). Like attention plans: a database hit
 * loads the stored choice and kernels; a miss is tuned (stage 1: the cost
 * model ranks the candidates; stage 2: the best are compiled, checked
 * against a reference and timed on scratch buffers) and stored under the
 * layer's key; STOF_TUNE_CACHE_ONLY takes the cost model's choice. The
 * planned layer owns the intermediate buffers for batch * seq tokens. `m` must be
 * seq x seq; it applies to every sequence and head.
 * Errors: STOF_ERR_INVALID_ARGUMENT, STOF_ERR_UNSUPPORTED, STOF_ERR_NO_DEVICE,
 * STOF_ERR_NVRTC, STOF_ERR_CUDA. */
STOF_API stof_status stof_layer_plan(stof_context *ctx,
                                     const stof_layer_desc *d,
                                     const stof_mask *m,
                                     stof_layer **layer /* OUT */);

/* Enqueue one layer on `stream`: y = layer(x), [tokens][hidden] each. y
 * may equal x. Never synchronises or allocates, so it can be captured
 * into a CUDA graph (stream capture) by the caller. Runs of one plan must
 * not overlap (they share its intermediate buffers). x must not alias the
 * layer's buffers; weights stay the caller's. */
STOF_API stof_status stof_layer_run(stof_layer *layer,
                                    const stof_layer_weights *w,
                                    const void *x, void *y, void *stream);

/* Flags of stof_layer_stack_run. */
#define STOF_STACK_GRAPH 1u /* capture the stack into a CUDA graph on the
                               first call and replay it while the pointers
                               (weights, x, y) stay the same */

/* Run n_layers layers with the same shape: layer i uses w[i]; x -> y
 * (y may equal x). With STOF_STACK_GRAPH the launches are recorded once
 * and later calls enqueue one graph launch; a call with other pointers
 * records again. Not capturable itself with STOF_STACK_GRAPH (use 0).
 * Pre-norm layers whose scheme has a stack ending (stof_layer_describe:
 * "junction_b": "stack") fuse each layer's input norm into the previous
 * layer's last GEMM, so a stack rounds slightly differently from
 * stof_layer_run layer by layer (within the dtype's rounding). */
STOF_API stof_status stof_layer_stack_run(stof_layer *layer, int n_layers,
                                          const stof_layer_weights *w,
                                          const void *x, void *y,
                                          void *stream, unsigned flags);

/* The layer warm-up over a mask family: stof_layer_plan with the
 * attention planned by stof_attention_plan_family (d->batch and d->seq the
 * largest; sample as there: host data, NULL = the default instance), so
 * that each run takes its own instance (a server's batch with its
 * sequences' lengths, documents, offsets) and nothing is planned again.
 * Tokens of padding rows (past q_len) go through the layer too, with an
 * attention output of zeros; their values are not meaningful. */
STOF_API stof_status stof_layer_plan_family(stof_context *ctx,
                                            const stof_layer_desc *d,
                                            const stof_mask_family *fam,
                                            const stof_mask_data *sample,
                                            stof_layer **layer /* OUT */);

/* stof_layer_run and stof_layer_stack_run of a family layer with this
 * call's instance data (device pointers, as stof_attention_run_family
 * takes them; NULL = the default instance). With STOF_STACK_GRAPH the
 * graph records the instance's pointers: a later call with the same
 * pointers replays it and reads their current contents, so a server
 * writes each batch's lengths into the same device buffers. */
STOF_API stof_status stof_layer_run_family(stof_layer *layer,
                                           const stof_mask_data *data,
                                           const stof_layer_weights *w,
                                           const void *x, void *y,
                                           void *stream);
STOF_API stof_status stof_layer_stack_run_family(
    stof_layer *layer, const stof_mask_data *data, int n_layers,
    const stof_layer_weights *w, const void *x, void *y, void *stream,
    unsigned flags);

/* JSON: the descriptor ("rope": null, or {"theta" (null with rope_freq),
 * "dim", "scale", "freq": "theta" or "table"}; "qk_norm" true or false;
 * "head_dim"), the fusion scheme (kernels in order with their parameters;
 * a QKV GEMM with RoPE says "rope": "fused" (in its epilogue) or "kernel"
 * (the rope kernel after it), one with a QK norm "qk_norm": "kernel" (the
 * qk kernel after it normalises and rotates; no "rope" of its own);
 * "scheme" also says whether its launches use programmatic dependent
 * launch, "pdl": on compute capability 9.0+ the search times
 * the layer's stack both ways in CUDA graphs and the record keeps its
 * choice, the faster where they differ by more than 1% ("pdl_ms":
 * {"off", "on"}, ms a layer, in the plan whose search timed it; null
 * otherwise); within that margin, and in a plan without that timing (an
 * older record, a cache-only miss), they are used at most 2048 tokens;
 * STOF_PDL=0 or 1 decides for every launch),
 * where it came from, measured times, where the plan's
 * time went ("plan_ms": attention, buffers, kernels) and the device
 * memory it holds besides the attention plan's ("device_bytes":
 * "buffers", the intermediates and the norm GEMMs' workspace; "cublaslt",
 * the workspace its cuBLASLt kernels need, 0 without any; the plan holds
 * their sum).
 * Size-then-fetch. */
STOF_API stof_status stof_layer_describe(const stof_layer *layer,
                                              char *buf, size_t n,
                                              size_t *needed /* OUT */);

/* The message of the last failed run on this plan. */
STOF_API const char *stof_layer_errmsg(const stof_layer *layer);

/* Free a planned layer (synchronise first) and set *layer to NULL. */
STOF_API void stof_layer_free(stof_layer **layer);

#ifdef __cplusplus
}
#endif

#endif /* STOF_H */
