/*
 * problem_key.c - the key a tuned attention kernel is stored under: XXH3-128
 * over everything that decides which kernel wins and whether its cubin is
 * valid: the operation, the mask digest, the problem's sizes, dtype and
 * layout, the device fingerprint (name, compute capability, SM count), the
 * driver and NVRTC versions, the stof version and the template hash. A
 * record from another GPU, driver, NVRTC or template version never matches.
 *
 * The layout is not part of the key: strides are run-time arguments of
 * every kernel, so a problem tuned with BHSD tensors (stof-tune) is the
 * same problem planned with BSHD or strided ones (Python, a server), and
 * hits the same record from every entry point.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "db.h"
#include "internal.h"
#include "cfmt.h"

#include <stdio.h>
#include <string.h>

void stof__attention_key(const stof_context *ctx, const stof_attention_desc *d,
                         const char *mask_hex, char key[33], char *text,
                         size_t text_n)
{
    const stof_device *dev = &ctx->device;
    char buf[1024];
    /* The canonical text is hashed; it is also a readable record of what
     * the key covers. */
    int n = snprintf(buf, sizeof(buf),
                     "op=attention;v=2;mask=%s;batch=%d;heads=%d;seq_q=%d;"
                     "seq_k=%d;head_dim=%d;dtype=%s;neg_scale=%d;"
                     "device=%s;cc=%d.%d;sms=%d;driver=%d;nvrtc=%d.%d;"
                     "stof=%s;templates=%016llx",
                     mask_hex, d->batch, d->heads, d->seq_q, d->seq_k,
                     d->head_dim, d->dtype == STOF_DTYPE_FP16 ? "fp16" : "bf16",
                     d->scale < 0.0f, dev->name,
                     dev->cc_major, dev->cc_minor, dev->sm_count,
                     dev->driver_version, dev->nvrtc_major, dev->nvrtc_minor,
                     stof_version_string(),
                     (unsigned long long)stof_template_hash());
    /* Grouped-query problems only (keys of the others are unchanged). */
    if (n > 0 && (size_t)n < sizeof(buf) && d->kv_heads > 0 &&
        d->kv_heads != d->heads)
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, ";kv_heads=%d",
                      d->kv_heads);
    /* Score modifiers: the soft-cap's value (its kernels are built for
     * any), whether ALiBi is on (not the slopes: launch data), whether a
     * bias tensor is added and along which of batch, head and row it
     * varies (its reads' reuse; not the strides themselves). */
    if (n > 0 && (size_t)n < sizeof(buf) && d->softcap > 0.0f)
        n += stof__c_snprintf(buf + n, sizeof(buf) - (size_t)n, ";softcap=%.9g",
                              (double)d->softcap);
    if (n > 0 && (size_t)n < sizeof(buf) && d->alibi_slopes)
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, ";alibi=1");
    if (n > 0 && (size_t)n < sizeof(buf) && d->bias)
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, ";bias=%d%d%d",
                      d->bias_stride[0] != 0, d->bias_stride[1] != 0,
                      d->bias_stride[2] != 0);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof(buf))
        n = (int)sizeof(buf) - 1;
    XXH128_hash_t h = XXH3_128bits(buf, (size_t)n);
    snprintf(key, 33, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    if (text && text_n)
        snprintf(text, text_n, "%s", buf);
}

void stof__record_env(const stof_context *ctx, stof_db_record *r)
{
    const stof_device *dev = &ctx->device;
    /* Device names are short; truncation only guards the array. */
    size_t nl = strlen(dev->name);
    if (nl >= sizeof(r->device_name))
        nl = sizeof(r->device_name) - 1;
    memcpy(r->device_name, dev->name, nl);
    r->device_name[nl] = '\0';
    r->cc_major = dev->cc_major;
    r->cc_minor = dev->cc_minor;
    r->sm_count = dev->sm_count;
    r->driver_version = dev->driver_version;
    snprintf(r->nvrtc_version, sizeof(r->nvrtc_version), "%d.%d",
             dev->nvrtc_major, dev->nvrtc_minor);
    snprintf(r->stof_version, sizeof(r->stof_version), "%s",
             stof_version_string());
    snprintf(r->template_hash, sizeof(r->template_hash), "%016llx",
             (unsigned long long)stof_template_hash());
}

int stof__record_same_build(const stof_db_record *r, const stof_db_record *env)
{
    return strcmp(r->device_name, env->device_name) == 0 &&
           r->cc_major == env->cc_major && r->cc_minor == env->cc_minor &&
           r->sm_count == env->sm_count &&
           r->driver_version == env->driver_version &&
           strcmp(r->nvrtc_version, env->nvrtc_version) == 0 &&
           strcmp(r->stof_version, env->stof_version) == 0 &&
           strcmp(r->template_hash, env->template_hash) == 0;
}
