/*
 * internal.h - definitions shared by the modules of libstof. Not installed.
 */
#ifndef STOF_INTERNAL_H
#define STOF_INTERNAL_H

#include "stof.h"

#include <math.h>
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
 * logs: stof works without one); NULL when unavailable (attention_plan.c). */
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
    void (*db_close)(struct stof_db **db); /* set with db (stof__ctx_db) */
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
    /* The GPU format builder of mask families (mask_build.c), compiled
     * once per context: later plans only load it. */
    void *mb_cubin;
    size_t mb_cubin_size;
    /* ... and loaded once (mask_build.c's kernels, shared by every plan of
     * the context; unloaded by mb_close at stof_close). */
    void *mb_kernels;
    void (*mb_close)(struct stof_context *ctx);
    /* Modules shared by the plans of this context (stof__module_load_
     * shared): a cubin loaded again (a layer planned again from the
     * database, the same kernel in another layer) reuses its module. */
    struct stof_modcache *modcache;
    /* A cuBLASLt handle held from stof_preload to stof_close, so that
     * cuBLASLt's start in this context is paid there rather than by the
     * first plan that uses it (blaslt.c; closed by lt_warm_close). */
    void *lt_warm;
    void (*lt_warm_close)(struct stof_context *ctx);
    /* Spec masks' GPU-built block formats shared by the plans of this
     * context (src/ops/format_cache.c), freed by fmtcache_close. */
    struct stof_fmtcache *fmtcache;
    void (*fmtcache_close)(struct stof_context *ctx);
    /* RoPE tables on the device shared by the layer plans of this
     * context (src/ops/rope_cache.c), freed by ropecache_close. */
    struct stof_ropecache *ropecache;
    void (*ropecache_close)(struct stof_context *ctx);
    /* Set while a database hit is being planned: spec masks' formats are
     * built on the GPU only if the builder is already compiled (a hit
     * compiles nothing), else on the host. */
    int hit_no_compile;
    /* Database records that could not be loaded or checked at their first
     * use on this host for want of memory (for the module or the check's
     * reference): kept and not used. The last one's reason; stof-tune
     * verify tells these from bad records. */
    int records_unchecked;
    char unchecked_why[512];
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
    /* stof_mask_digest of the bits, computed once when the constructor is
     * done with them (stof__mask_seal): planning a mask again does not hash
     * its bits again. Masks are immutable once sealed. */
    uint64_t digest[2];
    int sealed;
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

/* stof__fail without the log: for failures the caller may well recover
 * from (it logs what it decides). */
stof_status stof__fail_quiet(stof_context *ctx, stof_status st,
                             const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The tuning database's sink (cache/db.h) for a context: failures are
 * recorded on ctx (stof_errmsg) and logged, log lines go through ctx's
 * log. STOF_DB_SINK(ctx) is a pointer to one, valid in the enclosing
 * block. */
struct stof_db_sink;
stof_status stof__ctx_sink_fail(void *ctx, stof_status st, const char *msg);
void stof__ctx_sink_log(void *ctx, stof_log_level level, const char *msg);
void stof__ctx_sink_ok(void *ctx);
#define STOF_DB_SINK(ctx)                                                      \
    (&(struct stof_db_sink){(void *)(ctx), stof__ctx_sink_fail,               \
                            stof__ctx_sink_log, stof__ctx_sink_ok})

/* Where a record is valid, from ctx's device: device name, compute
 * capability, SM count, driver and NVRTC versions, stof version, template
 * hash (problem_key.c). */
struct stof_db_record;
void stof__record_env(const stof_context *ctx, struct stof_db_record *r);
/* Whether record r was made on the GPU and build that env (filled by
 * stof__record_env) describes: every field a key covers besides the
 * problem. */
int stof__record_same_build(const struct stof_db_record *r,
                            const struct stof_db_record *env);

/* stof_preload's choice (preload.c): the distinct cubins of db's records
 * that a plan on env's GPU and build could load (cuBLASLt records carry
 * none), most used first (the records' hits summed per cubin, then the
 * newest), at most max: XXH3-64 hashes and sizes into hash[] and size[].
 * Records failing their integrity check are left out and counted in *bad;
 * *lt counts the records of cuBLASLt algorithms (either may be NULL).
 * Returns how many, or minus a status. */
struct stof_db;
int stof__preload_pick(stof_context *ctx, struct stof_db *db,
                       const struct stof_db_record *env, int max,
                       uint64_t *hash /* OUT */, size_t *size /* OUT */,
                       int *bad /* OUT */, int *lt /* OUT */);

/* JSON through jansson (json.c). stof__json_out dumps v compactly into a
 * caller buffer (size-then-fetch, like stof__str_out) and releases v;
 * stof__json_text dumps it into a fixed field (0 when it does not fit)
 * and releases it. stof__json_ints reads the integers keys[0..n-1] of the
 * object in text into vals: 1 when each is there, an integer, in range;
 * other keys may be present. stof__json_str reads one string member. */
typedef struct json_t json_t;
stof_status stof__json_out(json_t *v, char *buf, size_t n,
                           size_t *needed /* OUT */);
int stof__json_text(json_t *v, char *buf, size_t n);
int stof__json_ints(const char *text, const char *const *keys, int n,
                    int *vals /* OUT */);
int stof__json_str(const char *text, const char *key, char *out, size_t n);

/* Milliseconds on the monotonic clock. */
double stof__now_ms(void);

/* Mark the last call on ctx as successful (clears the message). */
stof_status stof__ok(stof_context *ctx);

/* Log through the settings' callback when the level is enabled. */
void stof__log(stof_context *ctx, stof_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* A log callback that drops everything: the private contexts of pool
 * threads (their failures reach the search as text; $STOF_LOG is for the
 * caller's own context, and nothing may print from a pool thread). */
void stof__log_discard(void *user, stof_log_level level, const char *msg);

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
/* Count the allowed elements and seal the mask (its digest cached): the
 * last step of every constructor that fills the bits. */
void stof__mask_recount(stof_mask *m);
void stof__mask_seal(stof_mask *m);

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

/* Whether an additive bias element masks its key, as stof.h says and the
 * kernels do: -inf, or a value so negative that it overflows fp32 once
 * scaled by log2(e) (torch.finfo(bfloat16).min). */
static inline int stof__bias_masks(float bv)
{
    return bv < 0.0f && isinf(bv * 1.44269504f);
}

/* stof__ref_attention with the additive bias of a descriptor with bias =
 * 1: fp32, laid out as d->bias_stride says (an element that masks its key
 * by stof__bias_masks masks it); bias NULL for descriptors without one. */
stof_status stof__ref_attention_bias(const stof_attention_desc *d,
                                     const stof_mask *m, const float *q,
                                     const float *k, const float *v,
                                     const float *bias, float *o);

/* Whether an attention problem of these sizes (BHSD, the default scale)
 * and a layer descriptor (its sizes, dtype and options, and its
 * attention's) are valid, without a device: STOF_OK, or the error a plan
 * would give, with its message (attention.c, layer.c). For checks made
 * before any GPU work (stof-tune's workload files). */
stof_status stof__attention_shape_check(stof_context *ctx, int batch,
                                        int heads, int kv_heads, int seq_q,
                                        int seq_k, int head_dim,
                                        stof_dtype dt);
stof_status stof__layer_desc_check(stof_context *ctx,
                                   const stof_layer_desc *d);

/* What other modules may ask of an attention plan (attention.c): whether
 * it builds a mask family's formats per run, and its database key. */
int stof__plan_is_family(const stof_plan *p);
/* Query heads per K/V head of a descriptor (grouped-query attention; 1
 * without kv_heads). */
int stof__kv_group(const stof_attention_desc *d);
const char *stof__plan_key(const stof_plan *p);

/* A mask family's host sample instance (stof_attention_plan_family's) as
 * one blob, kept with a cache-only miss so that `stof-tune pending` can
 * plan the family again with the same instance: d is the user's
 * descriptor. NULL (nothing to keep) past max_bytes or without memory;
 * free() it. */
void *stof__family_sample_pack(const stof_attention_desc *d,
                               const stof_mask_data *h, size_t max_bytes,
                               size_t *n /* OUT */);
/* A cache-only plan's miss under key in db (for `stof-tune pending`): the
 * problem pj (consumed), to which the mask's spec and digest (mask_hex)
 * are added, or the family's spec and what became of its sample instance
 * `host` ("default" without one, "kept", "too large"); recorded with the
 * mask's bits, or the instance packed for d (up to 64 MB), as its blob.
 * A failure is logged on ctx. */
struct stof_db;
void stof__record_miss(stof_context *ctx, struct stof_db *db, const char *key,
                       json_t *pj, const stof_mask *m, const char *mask_hex,
                       const stof_mask_family *fam,
                       const stof_attention_desc *d,
                       const stof_mask_data *host);

/* The instance in a blob of stof__family_sample_pack for descriptor d:
 * *out's arrays point into blob (which must outlive it and be 8-byte
 * aligned). 0 when the blob is malformed or its arrays are shorter than
 * d needs (then *out is zeroed). */
int stof__family_sample_unpack(const stof_attention_desc *d, const void *blob,
                               size_t n, stof_mask_data *out /* OUT */);

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

/* Tests only (0 otherwise): when set, the first-use check of a database
 * record (attention, or a layer's kernels) cannot run, as without memory
 * for it. */
extern int stof__test_no_reference;

#endif /* STOF_INTERNAL_H */
