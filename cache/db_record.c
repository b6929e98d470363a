/*
 * db_record.c - what a tuning record must be before anything uses it: its
 * content hash (integrity of every field and the cubin) and the checks
 * that the database layer can make without knowing the kernels (known
 * words, sizes and versions in range, finite times, printable text, a
 * cubin where a kernel needs one). Each operation checks its own kernel
 * configuration on top (stof__record_check in src/).
 *
 * The hash is not a signature: anyone who can write a record can compute
 * it. It makes damage and inconsistent edits visible; trust in a cubin
 * comes from verifying it on this host (db.h, "Local trust").
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "db.h"
#include "cfmt.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Feed one named field to the hash: its name, its length and its bytes,
 * so that no two different records hash the same text. */
static void feed(XXH3_state_t *h, const char *name, const void *p, size_t n)
{
    uint64_t len = (uint64_t)n;
    XXH3_128bits_update(h, name, strlen(name) + 1);
    XXH3_128bits_update(h, &len, sizeof(len));
    if (n)
        XXH3_128bits_update(h, p, n);
}

static void feed_text(XXH3_state_t *h, const char *name, const char *t,
                      size_t cap)
{
    feed(h, name, t, strnlen(t, cap));
}

static void feed_num(XXH3_state_t *h, const char *name, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void feed_num(XXH3_state_t *h, const char *name, const char *fmt, ...)
{
    char buf[64];
    va_list ap;
    va_start(ap, fmt);
    int n = stof__c_vsnprintf(buf, sizeof(buf), fmt, ap); /* "1.5", never "1,5" */
    va_end(ap);
    feed(h, name, buf, n > 0 ? (size_t)n : 0);
}

void stof__db_record_hash(const stof_db_record *r, char out[33])
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, "stof record v2", 15);
    /* Every stored field in schema order; numbers in a fixed text form
     * (doubles with 17 digits round-trip exactly through SQLite). */
#define H_T(f) feed_text(&st, #f, r->f, sizeof(r->f));
#define H_I(f) feed_num(&st, #f, "%d", r->f);
#define H_L(f) feed_num(&st, #f, "%lld", (long long)r->f);
#define H_D(f) feed_num(&st, #f, "%.17g", r->f);
    H_T(key) H_T(op) H_T(mask_digest) H_T(mask_spec)
    H_I(batch) H_I(heads) H_I(seq_q) H_I(seq_k) H_I(head_dim) H_T(dtype)
    H_T(layout) H_T(device_name) H_I(cc_major) H_I(cc_minor) H_I(sm_count)
    H_I(driver_version) H_T(nvrtc_version) H_T(stof_version)
    H_T(template_hash) H_T(kernel) H_T(config) H_T(arch)
    H_D(time_ms) H_D(runner_up_ms) H_D(model_ms) H_I(n_candidates)
    H_I(verified) H_T(measured) H_L(created_at) H_T(host)
#undef H_T
#undef H_I
#undef H_L
#undef H_D
    feed(&st, "cubin", r->cubin, r->cubin ? r->cubin_size : 0);
    XXH128_hash_t d = XXH3_128bits_digest(&st);
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)d.high64,
             (unsigned long long)d.low64);
}

/* ----------------------------------------------------------- checks */

static int is_hex(const char *s, size_t len)
{
    if (strlen(s) != len)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* Printable ASCII only: what reaches a terminal or a JSON document from a
 * record can carry no control character, escape sequence or invalid
 * UTF-8. */
static int printable(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            return 0;
    return 1;
}

static int one_of(const char *s, const char *const *words)
{
    for (; *words; words++)
        if (!strcmp(s, *words))
            return 1;
    return 0;
}

/* "N.N" or "N.N.N" with small numbers. */
static int is_version(const char *s, int parts)
{
    int n = 0;
    for (int i = 0; i < parts; i++) {
        int digits = 0;
        while (s[n] >= '0' && s[n] <= '9' && digits < 4) {
            n++;
            digits++;
        }
        if (!digits)
            return 0;
        if (i + 1 < parts && s[n++] != '.')
            return 0;
    }
    return s[n] == '\0';
}

/* "sm_NN" or "sm_NNa". */
static int is_arch(const char *s)
{
    if (strncmp(s, "sm_", 3) != 0)
        return 0;
    int i = 3, digits = 0;
    while (s[i] >= '0' && s[i] <= '9') {
        i++;
        digits++;
    }
    if (s[i] == 'a')
        i++;
    return digits >= 2 && digits <= 3 && s[i] == '\0';
}

#define BAD(...) (snprintf(why, n, __VA_ARGS__), 0)

/* The largest cubin a record may carry: far above any stof kernel. */
#define CUBIN_MAX (64u << 20)

int stof__db_record_check(const stof_db_record *r, char *why, size_t n)
{
    static const char *const ops[] = {"attention", "gemm", "norm", "layer",
                                      "builder", NULL};
    static const char *const dtypes[] = {"fp16", "bf16", NULL};
    static const char *const layouts[] = {"BHSD", "BSHD", "strided", "rows",
                                          "layer", NULL};
    if (!is_hex(r->key, 32))
        return BAD("key is not 32 hex digits");
    if (!one_of(r->op, ops))
        return BAD("unknown op");
    if (r->mask_digest[0] && !is_hex(r->mask_digest, 32))
        return BAD("mask digest is not 32 hex digits");
    const struct {
        const char *name, *v;
    } texts[] = {{"mask_spec", r->mask_spec}, {"device_name", r->device_name},
                 {"kernel", r->kernel},       {"config", r->config},
                 {"measured", r->measured},   {"host", r->host}};
    for (size_t i = 0; i < sizeof(texts) / sizeof(*texts); i++)
        if (!printable(texts[i].v))
            return BAD("%s holds a control or non-ASCII character",
                       texts[i].name);
    const int dims[] = {r->batch, r->heads, r->seq_q, r->seq_k, r->head_dim};
    for (size_t i = 0; i < sizeof(dims) / sizeof(*dims); i++)
        if (dims[i] < 0 || dims[i] > (1 << 30))
            return BAD("a problem size (%d) is out of range", dims[i]);
    if (!one_of(r->dtype, dtypes))
        return BAD("unknown dtype");
    if (!one_of(r->layout, layouts))
        return BAD("unknown layout");
    if (!r->device_name[0])
        return BAD("no device name");
    if (r->cc_major < 1 || r->cc_major > 99 || r->cc_minor < 0 ||
        r->cc_minor > 9 || r->sm_count < 1 || r->sm_count > 65536 ||
        r->driver_version < 1)
        return BAD("device fields out of range");
    if (!is_version(r->nvrtc_version, 2) || !is_version(r->stof_version, 3))
        return BAD("malformed NVRTC or stof version");
    if (!is_hex(r->template_hash, 16))
        return BAD("template hash is not 16 hex digits");
    if (!r->kernel[0] || r->config[0] != '{' ||
        r->config[strlen(r->config) - 1] != '}')
        return BAD("no kernel or configuration");
    if (r->arch[0] && !is_arch(r->arch))
        return BAD("malformed architecture");
    if (!isfinite(r->time_ms) || !(r->time_ms > 0.0) || r->time_ms > 1e7)
        return BAD("time_ms %g is not a time (finite, above 0)", r->time_ms);
    if (!isfinite(r->runner_up_ms) || r->runner_up_ms < 0.0 ||
        !isfinite(r->model_ms) || r->model_ms < 0.0)
        return BAD("runner_up_ms or model_ms is negative or not finite");
    if (r->n_candidates < 0 || r->n_candidates > 1000000 ||
        (r->verified != 0 && r->verified != 1) || r->created_at < 0)
        return BAD("candidate count, verified flag or creation time out of "
                   "range");
    const int is_kernel = strcmp(r->op, "layer") != 0;
    if (is_kernel && (!r->cubin || r->cubin_size == 0))
        return BAD("no cubin");
    if (r->cubin_size > CUBIN_MAX)
        return BAD("cubin of %zu bytes is too large", r->cubin_size);
    if (!is_hex(r->content_hash, 32))
        return BAD("no content hash (a record of an older stof)");
    char h[33];
    stof__db_record_hash(r, h);
    if (strcmp(h, r->content_hash) != 0)
        return BAD("content hash does not match the record (damaged or "
                   "edited)");
    return 1;
}
