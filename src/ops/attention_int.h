/*
 * attention_int.h - what the attention operation's files share
 * (attention.c: the plan object; attention_plan.c: choosing its kernel
 * from the database or by searching; attention_search.c: the attention
 * operation of the search engine). Not for other modules.
 */
#ifndef STOF_ATTENTION_INT_H
#define STOF_ATTENTION_INT_H

#include "attn_block.h"
#include "attn_wgmma.h"
#include "cost_model.h"
#include "db.h"
#include "internal.h"
#include "mask_build.h"
#include "record_check.h"
#include "search.h"

#define REF_WARPS 4 /* STOF_REF_WARPS in attn_reference.cu */

/* Mirrors struct stof_attn_params in jit_templates/stof_common.cuh (the
 * reference kernels' arguments). */
typedef struct stof_attn_params {
    CUdeviceptr q, k, v, o;
    CUdeviceptr mask_bits;
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
    int batch, heads, seq_q, seq_k;
    int mask_words;
    float scale;
    int kv_group; /* query heads per K/V head, >= 1 */
    CUdeviceptr lse; /* 0, or float[batch][heads][seq_q] */
    float softcap;   /* 0, or the soft-cap */
    int pad_;
    CUdeviceptr alibi; /* 0, or float[heads] ALiBi slopes */
    CUdeviceptr bias;  /* 0, or the additive bias (16-bit) */
    int64_t bias_stride[3];
} stof_attn_params;
_Static_assert(sizeof(stof_attn_params) ==
                   5 * 8 + 12 * 8 + 8 * 4 + 8 + 16 + 4 * 8,
               "stof_attn_params must match stof_common.cuh");

struct stof_plan {
    stof_context *ctx;
    int kind;                 /* STOF_KERNEL_* */
    stof_block_cfg cfg;       /* block / row-wise kernels */
    stof_wgmma_cfg wcfg;      /* wgmma kernel */
    stof_block_format bf;     /* block / wgmma kernels: the device tile BSR */
    stof_rowwise_format rf;   /* row-wise kernel: compacted key tiles */
    CUdeviceptr d_row_order;  /* wgmma kernels: row blocks, heaviest first */
    CUdeviceptr d_sched;      /* persistent wgmma kernels: 0, or the items
                                 dealt to the CTAs on the host
                                 (stof__wgmma_persist_list) */
    int64_t sched_items;      /* the work items (row blocks x batch x
                                 heads) d_sched deals: a launch of other
                                 sizes (the first-use check's one batch
                                 element and two heads, packed calls)
                                 runs the kernel's own deal */
    unsigned char order_shared, sched_shared; /* d_row_order / d_sched
                                 belong to the shared format (fmt_ref):
                                 not freed with the plan */
    int persist_heads;        /* persistent wgmma kernel: its schedule
                                 (stof__wgmma_persist_heads: 0 in order,
                                 G or -G groups of G (batch, head)s) */
    int group;                /* row grouping period (row-wise kinds) */
    CUdeviceptr d_q_rows;     /* with group > 1: query row of each format
                                 row (int32[seq_q]) */
    int n_split;              /* split-KV: CTAs per row block (>= 2), or 0;
                                 cfg.split / wcfg.split set with it */
    CUdeviceptr d_split;      /* its partials (stof__split_bytes of desc) */
    CUfunction fn_combine;    /* stof_attn_combine of module */
    int gqa_rows;             /* planned as the grouped-query row view
                                 (gqa_rows_view in attention_plan.c):
                                 the query heads per K/V head; else 0 */
    int mods;                 /* STOF_MOD_* of the problem (cfg.mods and
                                 wcfg.mods are set with it) */
    CUdeviceptr d_alibi;      /* ALiBi: float[heads] slopes, or 0 */
    float *alibi_host;        /* their host copy (a record's first-use
                                 check computes its reference with them) */
    double predicted_ms;      /* cost model; 0 for the reference kernel */
    int n_candidates;         /* candidates ranked (stage 1) / timed */
    const char *source;       /* "compiled", "tuned", "user db", "system db",
                                 "fallback" */
    double time_ms;           /* measured by the search, or 0 */
    double runner_up_ms, model_ms;
    char key[33];             /* tuning-database key */
    stof_attention_desc desc;
    float scale;
    char mask_hex[33];
    double mask_density;
    int mask_words;
    CUdeviceptr d_mask;
    CUmodule module;
    CUfunction fn;
    unsigned grid[3], block[3];
    char arch[16];
    double compile_ms, load_ms;
    double key_ms;            /* the problem's key (mask digest, or a
                                 family's GPU statistics) */
    double lookup_ms;         /* the database lookup, 0 without one */
    int by_hash;              /* its record's module found in the context's
                                 cache by the cubin's hash, the bytes left
                                 in the database's memory (tests) */
    double formats_ms;        /* formats built and uploaded (or the GPU
                                 builder's workspace made) */
    int formats_gpu;          /* the formats were built on the GPU */
    void *fmt_ref;            /* bf is the context's shared copy
                                 (format_cache.c): released, not freed */
    double verify_ms;         /* the first use of a record on this host:
                                 the time its check took (0: none) */
    char errmsg[1024];
    /* Mask families (attention_family.c): the formats are built on the GPU
     * from each run's instance data into mb_ws, which bf views
     * (bf.rp_stride = n_row_blocks; bf.mem is mb_ws.mem, not owned). */
    int family;
    int n_seq;                /* packed layout: the sequences (desc is the
                                 kernels' view: batch 1, strided) */
    stof_mb_kernels mb_k;
    stof_mb_workspace mb_ws;
    int fmt_valid;            /* mb_ws holds the format of fmt_data */
    int fmt_captured;         /* ... built in a stream capture */
    unsigned long long fmt_capture_id; /* ... that capture (0: unknown) */
    int ever_captured;        /* a format was built in a capture */
    stof_mask_data fmt_data;  /* the instance data of the last build (a
                                 copy of the struct: device pointers) */
    char family_spec[256];
    char family_key[640];     /* the text its database key hashes */
};


/* Check a descriptor against a mask; *scale is the scale to use. Messages
 * name the offending field. */
stof_status stof__attention_check_desc(stof_context *ctx,
                                       const stof_attention_desc *d,
                                       const stof_mask *m, float *scale);

/* The checks of stof__attention_check_desc that do not involve a mask
 * (mask families: the sizes are the plan's maximum). */
stof_status stof__attention_check_problem(stof_context *ctx,
                                          const stof_attention_desc *d,
                                          float *scale);

/* The same, and a usable device (STOF_ERR_NO_DEVICE with the reason). */
stof_status stof__attention_check_ready(stof_context *ctx,
                                        const stof_attention_desc *d,
                                        const stof_mask *m, float *scale);

/* For BHSD/BSHD, the strides the layout implies, whatever the fields held. */
void stof__attention_normalise(stof_attention_desc *d);

/* What a plan is made for: a mask (bit matrix), or a mask family with a
 * sample instance in device memory (for the GPU format builder and the
 * family reference). */
typedef struct stof_attn_problem {
    const stof_mask *m; /* or NULL: a family */
    const stof_mask_family *fam;
    const stof_mask_data *dev;
    /* A family's host sample and the caller's descriptor (packed: before
     * the kernels' view), kept with a cache-only miss. */
    const stof_mask_data *host;
    const stof_attention_desc *user;
} stof_attn_problem;

/* Stage 1 for a family problem: the block-format kinds ranked on the
 * formats of the sample's sequence 0, built on the GPU at each tiling
 * (only the per-row-block tile counts come back to the host). */
stof_status stof__family_rank(stof_context *ctx, const stof_attention_desc *d,
                              const stof_attn_problem *pr,
                              stof_candidate *cands, int max, int *n /* OUT */);

/* The GPU format builder's cubin on ctx (family_builder.c): already there,
 * from a trusted database record, or (may_compile) compiled now and
 * stored. Without it and without may_compile: STOF_ERR_UNSUPPORTED,
 * nothing recorded. */
stof_status stof__family_builder_cubin(stof_context *ctx, int may_compile);

/* stof_preload: load the GPU format builder from its trusted database
 * record, so that the first spec mask a plan builds on the GPU does not
 * (family_builder.c). 1 loaded, 0 loaded before or no usable record,
 * else minus a status. */
int stof__family_builder_preload(stof_context *ctx);

/* stof_attention_plan for problem pr with the database key `key` (NULL:
 * the mask's own; required for a family) and, when tuning, only the kernel
 * kinds in `kinds` (bit 1 << kind; 0: every kind; a family's plans are of
 * the block-format kinds whatever it holds). */
stof_status stof__attention_plan_problem(stof_context *ctx,
                                         const stof_attention_desc *d,
                                         const stof_attn_problem *pr,
                                         const char *key, unsigned kinds,
                                         stof_plan **out /* OUT */);

/* The length bucket of a family problem's key (attention_family.c): the
 * smallest of 128, 192, 256, 384, 512, 768, ... (2^j and 3 * 2^(j-1)) that
 * is at least n. */
int stof__family_len_bucket(int n);

/* Enqueue a family plan's format build for instance data `data` (device
 * pointers; NULL = the default instance) on stream s. The caller makes the
 * device's context current. */
stof_status stof__attention_family_build(stof_plan *p,
                                         const stof_mask_data *data,
                                         CUstream s);

/* A split plan's merge kernel (from its loaded module) and workspace (for
 * its descriptor); nothing for other plans. Records the error. */
stof_status stof__plan_split_prepare(stof_context *ctx, stof_plan *p);

/* A plan's ALiBi slopes (d->alibi_slopes, host) copied to the device
 * (p->d_alibi); nothing without. Records the error. */
stof_status stof__plan_mods_prepare(stof_context *ctx, stof_plan *p,
                                    const stof_attention_desc *d);

/* Enqueue plan p's kernels on stream s for the run's instance data (NULL
 * or a packed plan's totals): the attention kernel and, for a split
 * plan, the merge. The caller made the device's context current and
 * built a family plan's formats. *cu: the driver's error when a launch
 * failed (CUDA_SUCCESS otherwise, or when the arguments were refused). */
stof_status stof__plan_launch(const stof_plan *p, const stof_mask_data *data,
                              CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
                              CUdeviceptr o, CUdeviceptr lse,
                              CUdeviceptr bias, CUstream s, CUresult *cu);

/* Free a plan's device data and the plan. */
void stof__plan_release(stof_plan *p);

/* "block", "rowwise", "wgmma", "wgmma-gather" or "reference". */
const char *stof__kernel_kind_name(int kind);

/* Plan with a given kernel choice (NULL = the cost model's first choice;
 * kind STOF_KERNEL_REFERENCE = the reference kernel). Used by
 * stof_attention_plan, the tests and the search. */
stof_status stof__attention_plan_kernel(stof_context *ctx,
                                        const stof_attention_desc *d,
                                        const stof_mask *m,
                                        const stof_candidate *choice,
                                        stof_plan **out /* OUT */);

/* A new plan for candidate c (kind, configurations, row grouping, the
 * model's time) on problem d (normalised) with softmax scale `scale`: no
 * formats, no kernel. */
stof_status stof__plan_new(stof_context *ctx, const stof_attention_desc *d,
                           float scale, const stof_candidate *c,
                           stof_plan **out /* OUT */);

/* Load a cubin (`size` bytes) into plan p (kind and configuration set)
 * through the context's module cache: module, function, shared memory
 * limit and, for the reference kernel, the launch shape. hash: the
 * cubin's XXH3-64 when known (0: computed here); with cubin NULL only a
 * module the cache holds is used, STOF_ERR_NOT_FOUND (no message) when
 * it holds none. */
stof_status stof__plan_attach(stof_context *ctx, stof_plan *p,
                              const void *cubin, size_t size, uint64_t hash);

/* Compile c, or for the reference kernel take the context's copy of an
 * earlier compile (a malloc'd copy either way; the reference module also
 * holds the family reference and the search's fill and compare kernels,
 * attn_reference.cu). */
stof_status stof__kernel_cubin(stof_context *ctx, const stof_candidate *c,
                               int head_dim, stof_dtype dt,
                               void **cubin /* OUT */, size_t *size /* OUT */);

/* Compile a candidate's kernel with NVRTC (no GPU work; thread-safe for
 * distinct contexts): *cubin is malloc'd. */
stof_status stof__kernel_compile(stof_context *ctx, const stof_candidate *c,
                                 int head_dim, stof_dtype dt,
                                 void **cubin /* OUT */, size_t *size /* OUT */);

/* A plan for candidate c whose kernel is the given cubin (from the search
 * or the tuning database): formats are built and uploaded, the cubin is
 * loaded, nothing is compiled. hash, cubin NULL: as stof__plan_attach. */
stof_status stof__plan_from_cubin(stof_context *ctx,
                                  const stof_attention_desc *d,
                                  const stof_mask *m, const stof_candidate *c,
                                  const void *cubin, size_t size,
                                  uint64_t hash, stof_plan **out /* OUT */);

/* The attention operation of the search engine (attention_search.c) for
 * problem (d, m) over the candidates cands[0..n-1] (rank order): random
 * inputs from `seed`, the reference output computed once, `reps` timed
 * runs per candidate (0 = 15). *op is ready for stof__search_run; free
 * with stof__attention_op_free. The operation borrows ctx, d, m and cands
 * until freed. */
typedef struct stof_attention_op stof_attention_op;
stof_status stof__attention_op_new(stof_context *ctx,
                                   const stof_attention_desc *d,
                                   const stof_mask *m,
                                   const stof_candidate *cands, int n,
                                   uint64_t seed, int reps,
                                   stof_attention_op **out /* OUT */,
                                   stof_search_op *op /* OUT */);
void stof__attention_op_free(stof_attention_op **a);

/* The same for a mask family without a bit matrix: `sample` is instance
 * data in device memory (kept by the op until freed); plans are family
 * plans (stof__family_plan_from_cubin) whose runs build the sample's
 * formats; inputs, the reference (attn_reference.cu's family kernel) and
 * the comparison are on the GPU, over heads 0 .. ref_heads - 1 of every
 * sequence (each head runs the same code; every sequence has its own
 * instance). */
stof_status stof__attention_family_op_new(
    stof_context *ctx, const stof_attention_desc *d,
    const stof_mask_family *fam, const stof_mask_data *sample,
    const stof_candidate *cands, int n, uint64_t seed, int reps,
    int ref_heads, stof_attention_op **out /* OUT */,
    stof_search_op *op /* OUT */);

/* A family plan for candidate c with the given cubin: the GPU format
 * builder attached (its workspace for d's batch and lengths), no bit
 * matrix, nothing compiled but the builder (once per context). */
stof_status stof__family_plan_from_cubin(stof_context *ctx,
                                         const stof_attention_desc *d,
                                         const stof_mask_family *fam,
                                         const stof_candidate *c,
                                         const void *cubin, size_t size,
                                         uint64_t hash,
                                         stof_plan **out /* OUT */);

/* The context's shared block formats (format_cache.c), keyed by the mask's
 * digest (hex), sequence lengths and tile. get: on a hit *bf views the
 * shared format, *gpu says where it was built and *counts (when asked) is
 * a private copy of its row_ptr and kind; a handle to release with
 * stof__fmtcache_unref, or NULL. put: the cache takes bf's memory and a
 * copy of counts' row_ptr and kind (a handle, the caller's reference), or
 * NULL, leaving both with the caller (every entry referenced). */
void *stof__fmtcache_get(stof_context *ctx, const char *mask_hex, int seq_q,
                         int seq_k, int block_m, int block_n,
                         stof_block_format *bf, int *gpu,
                         stof_format **counts);
void *stof__fmtcache_put(stof_context *ctx, const char *mask_hex, int seq_q,
                         int seq_k, int block_m, int block_n,
                         const stof_block_format *bf, int gpu,
                         const stof_format *counts);
void stof__fmtcache_unref(stof_context *ctx, void *h);
/* Device arrays derived from a shared format (h: a reference the caller
 * holds), kept with it under a key of STOF_FMTCACHE_KEY ints that names all
 * their other inputs (compared whole), with one int. find: the kept array
 * (0: none) and its value, now held by the caller too. keep: d (bytes
 * long) handed to the entry and held by the caller (1), or left the
 * caller's (0: an array under that key came first, or no room among the
 * arrays other plans hold). A held array stays until released (release,
 * before unref); the entry frees it. */
#define STOF_FMTCACHE_KEY 20
CUdeviceptr stof__fmtcache_find_array(stof_context *ctx, void *h,
                                      const int32_t *key, int32_t *value);
int stof__fmtcache_keep_array(stof_context *ctx, void *h, const int32_t *key,
                              CUdeviceptr d, size_t bytes, int32_t value);
void stof__fmtcache_release_array(stof_context *ctx, void *h, CUdeviceptr d);

/* The block format of the mask of `spec` (seq_q x seq_k, as
 * stof_mask_from_spec makes it) built on the GPU once, for a plan that
 * never rebuilds it (rp_stride 0); with counts, also the host format of
 * its tile counts (for the wgmma row order). STOF_ERR_UNSUPPORTED, with
 * nothing recorded, when the GPU does not evaluate the spec (random,
 * bigbird) or the tiles do not fit: build it on the CPU then. */
stof_status stof__spec_block_format_gpu(stof_context *ctx, const char *spec,
                                        int seq_q, int seq_k, int block_m,
                                        int block_n,
                                        stof_block_format *bf /* OUT */,
                                        stof_format **counts /* OUT */);

/* The same for the row-wise format of the gather kernels (block_n a
 * multiple of 32), rows grouped mod `group` when it is above 1; counts:
 * a host format holding only n_row_blocks and rw_ptr (the gather row
 * order's input). */
stof_status stof__spec_rowwise_format_gpu(stof_context *ctx, const char *spec,
                                          int seq_q, int seq_k, int block_m,
                                          int block_n, int group,
                                          stof_rowwise_format *rf /* OUT */,
                                          stof_format **counts /* OUT */);

/* Public instance data (device pointers) as the builder's. */
void stof__family_mb_data(const stof_mask_data *data, stof_mb_data *md);

/* Run plan p (made for any batch and heads of the op's problem) on the
 * op's verification inputs, launched for the op's descriptor, and compare
 * with the reference: the relative error, or nonzero with err set. */
int stof__attention_op_check(stof_attention_op *a, const stof_plan *p,
                             double *rel_err, char *err, size_t errn);

#endif
