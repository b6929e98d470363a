/*
 * family_builder.c - the GPU format builder's cubin (mask_build.cu): kept
 * in the user's tuning database (op "builder", one record per device,
 * driver, NVRTC, stof and template version), so that a process whose plans
 * hit the database compiles nothing and still builds formats on the GPU.
 * Like every record, it is used only where this host trusts it (made
 * here).
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "attention_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void builder_key(const stof_context *ctx, char key[33])
{
    const stof_device *dev = &ctx->device;
    char text[512];
    int n = snprintf(text, sizeof(text),
                     "builder;v=1;arch=%s;cc=%d.%d;driver=%d;nvrtc=%d.%d;"
                     "templates=%016llx;stof=%s;device=%s",
                     dev->arch, dev->cc_major, dev->cc_minor,
                     dev->driver_version, dev->nvrtc_major, dev->nvrtc_minor,
                     (unsigned long long)stof_template_hash(),
                     stof_version_string(), dev->name);
    if (n < 0 || (size_t)n >= sizeof(text))
        n = (int)sizeof(text) - 1;
    XXH128_hash_t h = XXH3_128bits(text, (size_t)n);
    snprintf(key, 33, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
}

stof_status stof__family_builder_cubin(stof_context *ctx, int may_compile)
{
    if (ctx->mb_cubin)
        return STOF_OK;
    stof_db *db = stof__ctx_db(ctx);
    char key[33];
    builder_key(ctx, key);
    stof_db_record rec;
    if (db && ctx->settings.tuning_mode != STOF_TUNE_FORCE &&
        stof__db_lookup(db, key, &rec) == STOF_OK) {
        if (!strcmp(rec.op, "builder") && rec.cubin && rec.cubin_size &&
            stof__db_trusted(db, &rec) &&
            (ctx->mb_cubin = malloc(rec.cubin_size))) {
            memcpy(ctx->mb_cubin, rec.cubin, rec.cubin_size);
            ctx->mb_cubin_size = rec.cubin_size;
        }
        stof__db_record_clear(&rec);
        if (ctx->mb_cubin)
            return STOF_OK;
    }
    if (!may_compile)
        return STOF_ERR_UNSUPPORTED;
    const double t0 = stof__now_ms();
    stof_mb_kernels k;
    stof_status st = stof__mb_load(ctx, &k); /* compiles it */
    stof__mb_unload(ctx, &k);
    if (st != STOF_OK || !db || !stof__db_writable(db))
        return st;
    memset(&rec, 0, sizeof(rec));
    snprintf(rec.key, sizeof(rec.key), "%s", key);
    snprintf(rec.op, sizeof(rec.op), "builder");
    snprintf(rec.kernel, sizeof(rec.kernel), "mask_build");
    snprintf(rec.config, sizeof(rec.config), "{}");
    snprintf(rec.dtype, sizeof(rec.dtype), "fp16");
    snprintf(rec.layout, sizeof(rec.layout), "rows");
    snprintf(rec.arch, sizeof(rec.arch), "%s", ctx->device.arch);
    stof__record_env(ctx, &rec);
    rec.cubin = ctx->mb_cubin;
    rec.cubin_size = ctx->mb_cubin_size;
    rec.time_ms = stof__now_ms() - t0 > 0.001 ? stof__now_ms() - t0 : 0.001;
    rec.verified = 1;
    if (stof__db_store(db, &rec, 0, 1) != STOF_OK)
        stof__log(ctx, STOF_LOG_WARN,
                  "could not store the format builder: %s", stof_errmsg(ctx));
    return STOF_OK;
}

int stof__family_builder_preload(stof_context *ctx)
{
    if (ctx->mb_kernels)
        return 0;
    if (stof__family_builder_cubin(ctx, 0) != STOF_OK)
        return 0;
    stof_mb_kernels k;
    const stof_status st = stof__mb_load(ctx, &k);
    stof__mb_unload(ctx, &k); /* (the context's: stays loaded) */
    return st == STOF_OK ? 1 : -(int)st;
}

