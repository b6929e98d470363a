/*
 * bench_hopper.h - what the Hopper kernel programs of bench/ share
 * (stof-bench-wgmma, stof-trace-wgmma).
 */
#ifndef STOF_BENCH_HOPPER_H
#define STOF_BENCH_HOPPER_H

#include "attn_wgmma.h"
#include "internal.h"

#include <stdio.h>

/* A context on a GPU the wgmma kernel runs on (compute capability 9.0),
 * or NULL once stderr says why (the program then exits 77: skipped). */
static inline stof_context *bench_open_hopper(void)
{
    stof_context *ctx = NULL;
    stof_settings s;
    stof_default_settings(&s);
    s.require_device = 1;
    if (stof_open(&ctx, &s) != STOF_OK) {
        fprintf(stderr, "stof_open: %s\n", stof_errmsg(ctx));
        stof_close(&ctx);
        return NULL;
    }
    if (!stof__wgmma_device_ok(&ctx->device)) {
        fprintf(stderr, "%s is cc %d.%d: the wgmma kernel needs 9.0\n",
                ctx->device.name, ctx->device.cc_major, ctx->device.cc_minor);
        stof_close(&ctx);
        return NULL;
    }
    return ctx;
}

#endif
