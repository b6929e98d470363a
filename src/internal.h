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

struct stof_context {
    stof_settings settings;
    stof_status last_status;
    char errmsg[STOF_ERRMSG_MAX];
    stof_device device;
    const stof_api *api;    /* loaded driver/NVRTC table (may lack either) */
};

struct stof_mask {
    int seq_q, seq_k;
    int words_per_row;      /* 64-bit words per row: ceil(seq_k / 64) */
    uint64_t *bits;         /* seq_q * words_per_row; bits past seq_k are 0 */
    uint64_t count;         /* allowed elements */
};

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
/* Copy s into a caller buffer with the size-then-fetch convention. */
stof_status stof__str_out(const stof_str *s, char *buf, size_t n,
                          size_t *needed);

/* Mask internals (mask.c). */
stof_status stof__mask_alloc(stof_context *ctx, int seq_q, int seq_k,
                             stof_mask **out);
void stof__mask_recount(stof_mask *m);

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

#endif /* STOF_INTERNAL_H */
