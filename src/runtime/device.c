/*
 * device.c - the device a context works on: driver initialisation, the
 * device fingerprint, the retained primary context, the NVRTC target
 * architecture, and stof_device_describe().
 */
#include "internal.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "NAME (text)" for a driver result, into `buf`. */
static const char *cu_error_text(const stof_api *a, CUresult r, char *buf,
                                 size_t n)
{
    const char *name = NULL, *text = NULL;
    if (a->cuGetErrorName && a->cuGetErrorName(r, &name) != CUDA_SUCCESS)
        name = NULL;
    if (a->cuGetErrorString && a->cuGetErrorString(r, &text) != CUDA_SUCCESS)
        text = NULL;
    if (name && text)
        snprintf(buf, n, "%s (%s)", name, text);
    else if (name)
        snprintf(buf, n, "%s", name);
    else if (r == CUDA_ERROR_STUB_LIBRARY) /* the stub cannot name it */
        snprintf(buf, n, "CUDA_ERROR_STUB_LIBRARY (the CUDA toolkit's stub "
                         "libcuda was loaded instead of the driver's)");
    else
        snprintf(buf, n, "CUresult %d", (int)r);
    return buf;
}

/* Results that mean "there is no usable GPU here" rather than "a call went
 * wrong": they make stof_open fail with STOF_ERR_NO_DEVICE. */
static int means_no_device(CUresult r)
{
    switch (r) {
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_SYSTEM_NOT_READY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_NOT_PERMITTED:
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_OPERATING_SYSTEM:
        return 1;
    default:
        return 0;
    }
}

/* Record a failed driver call made while finding the device. */
static int init_fail(stof_context *ctx, CUresult r, int always_no_device,
                     const char *what)
{
    char err[256];
    cu_error_text(ctx->api, r, err, sizeof(err));
    stof_status st = (always_no_device || means_no_device(r))
                         ? STOF_ERR_NO_DEVICE
                         : STOF_ERR_CUDA;
    return stof__fail(ctx, st, "no usable CUDA device: %s failed: %s", what,
                      err);
}

/* Choose the architecture NVRTC compiles for: the device's own when this
 * NVRTC supports it, else the highest supported one below it (a cubin runs
 * on later minor versions of the same major). */
static void pick_arch(stof_context *ctx)
{
    stof_device *d = &ctx->device;
    const stof_api *a = ctx->api;
    int cc = d->cc_major * 10 + d->cc_minor;
    snprintf(d->arch, sizeof(d->arch), "sm_%d%d", d->cc_major, d->cc_minor);
    if (!a->has_nvrtc) {
        stof__log(ctx, STOF_LOG_INFO,
                  "NVRTC is not available (%s): only kernels from a tuning "
                  "database can be loaded",
                  a->nvrtc_why);
        return;
    }
    int n = 0;
    if (a->nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0)
        return;
    int *archs = malloc((size_t)n * sizeof(*archs));
    if (!archs)
        return;
    int best = -1, exact = 0;
    if (a->nvrtcGetSupportedArchs(archs) == NVRTC_SUCCESS) {
        for (int i = 0; i < n; i++) {
            if (archs[i] == cc)
                exact = 1;
            if (archs[i] <= cc && archs[i] > best)
                best = archs[i];
        }
    }
    free(archs);
    if (exact || best < 0) {
        if (!exact)
            stof__log(ctx, STOF_LOG_WARN,
                      "NVRTC %d.%d cannot target %s or any earlier "
                      "architecture: compiles for this device will fail",
                      d->nvrtc_major, d->nvrtc_minor, d->arch);
        return;
    }
    char dev_arch[16];
    memcpy(dev_arch, d->arch, sizeof(dev_arch));
    snprintf(d->arch, sizeof(d->arch), "sm_%d", best);
    stof__log(ctx, STOF_LOG_WARN,
              "NVRTC %d.%d cannot target %s; compiling for %s instead%s",
              d->nvrtc_major, d->nvrtc_minor, dev_arch, d->arch,
              best / 10 == d->cc_major
                  ? ""
                  : " (a different major architecture: its cubins will not "
                    "load; install a newer CUDA toolkit)");
}

int stof__device_init(struct stof_context *ctx, int ordinal)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    stof_device *d = &ctx->device;
    memset(d, 0, sizeof(*d));
    d->ordinal = ordinal;
    if (!ctx->api)
        ctx->api = stof__api();
    const stof_api *a = ctx->api;
    if (ctx->device.why[0])
        return stof__fail(ctx, STOF_ERR_NO_DEVICE, "%s", ctx->device.why);
    if (!a->has_cuda)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE, "no CUDA driver: %s",
                          a->cuda_why);

    CUresult r = a->cuInit(0);
    if (r != CUDA_SUCCESS)
        return init_fail(ctx, r, 1, "cuInit(0)");
    r = a->cuDriverGetVersion(&d->driver_version);
    if (r != CUDA_SUCCESS)
        return init_fail(ctx, r, 0, "cuDriverGetVersion");
    int count = 0;
    r = a->cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS)
        return init_fail(ctx, r, 1, "cuDeviceGetCount");
    if (count <= 0)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE,
                          "no CUDA device found (driver %d.%d is loaded)",
                          d->driver_version / 1000,
                          d->driver_version % 1000 / 10);
    if (ordinal < 0 || ordinal >= count)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "settings.device: %d is out of range: %d CUDA "
                          "device%s found (ordinals 0..%d)",
                          ordinal, count, count == 1 ? "" : "s", count - 1);

    r = a->cuDeviceGet(&d->dev, ordinal);
    if (r != CUDA_SUCCESS)
        return init_fail(ctx, r, 0, "cuDeviceGet");
    r = a->cuDeviceGetName(d->name, (int)sizeof(d->name) - 1, d->dev);
    if (r != CUDA_SUCCESS)
        return init_fail(ctx, r, 0, "cuDeviceGetName");
    d->name[sizeof(d->name) - 1] = '\0';

    static const struct {
        CUdevice_attribute attr;
        size_t off;
        const char *what;
    } attrs[] = {
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
         offsetof(stof_device, cc_major), "compute capability"},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
         offsetof(stof_device, cc_minor), "compute capability"},
        {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
         offsetof(stof_device, sm_count), "multiprocessor count"},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
         offsetof(stof_device, max_smem_optin), "opt-in shared memory"},
        {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, offsetof(stof_device, l2_bytes),
         "L2 cache size"},
    };
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        int v = 0;
        r = a->cuDeviceGetAttribute(&v, attrs[i].attr, d->dev);
        if (r != CUDA_SUCCESS) {
            char what[96];
            snprintf(what, sizeof(what), "cuDeviceGetAttribute (%s)",
                     attrs[i].what);
            return init_fail(ctx, r, 0, what);
        }
        memcpy((char *)d + attrs[i].off, &v, sizeof(v));
    }
    r = a->cuDeviceTotalMem(&d->total_mem, d->dev);
    if (r != CUDA_SUCCESS)
        return init_fail(ctx, r, 0, "cuDeviceTotalMem");

    if (a->has_nvrtc &&
        a->nvrtcVersion(&d->nvrtc_major, &d->nvrtc_minor) != NVRTC_SUCCESS)
        d->nvrtc_major = d->nvrtc_minor = 0;
    pick_arch(ctx);

    r = a->cuDevicePrimaryCtxRetain(&d->pctx, d->dev);
    if (r != CUDA_SUCCESS) {
        d->pctx = NULL;
        return init_fail(ctx, r, 0, "cuDevicePrimaryCtxRetain");
    }
    d->ok = 1;
    stof__log(ctx, STOF_LOG_INFO,
              "device %d: %s, compute capability %d.%d, %d SMs, driver "
              "%d.%d, NVRTC %d.%d, target %s",
              ordinal, d->name, d->cc_major, d->cc_minor, d->sm_count,
              d->driver_version / 1000, d->driver_version % 1000 / 10,
              d->nvrtc_major, d->nvrtc_minor, d->arch);
    return STOF_OK;
}

void stof__device_release(struct stof_context *ctx)
{
    if (!ctx || !ctx->device.ok)
        return;
    const stof_api *a = ctx->api;
    if (a && a->has_cuda && ctx->device.pctx)
        a->cuDevicePrimaryCtxRelease(ctx->device.dev);
    ctx->device.pctx = NULL;
    ctx->device.ok = 0;
}

/* Fail with STOF_ERR_NO_DEVICE for a context that has no device, with the
 * reason stof_open recorded in ctx->device.why. */
static stof_status no_device(stof_context *ctx)
{
    const stof_api *a = ctx->api ? ctx->api : stof__api();
    if (ctx->device.why[0])
        return stof__fail(ctx, STOF_ERR_NO_DEVICE, "%s", ctx->device.why);
    if (!a->has_cuda)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE, "no CUDA driver: %s",
                          a->cuda_why);
    return stof__fail(ctx, STOF_ERR_NO_DEVICE,
                      "no usable CUDA device: device %d could not be "
                      "initialised when the context was opened (open with "
                      "settings.require_device = 1 to see why)",
                      ctx->settings.device);
}

int stof__ctx_push(struct stof_context *ctx)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    if (!ctx->device.ok)
        return no_device(ctx);
    STOF_CU(ctx, ctx->api->cuCtxPushCurrent(ctx->device.pctx));
    return STOF_OK;
}

void stof__ctx_pop(struct stof_context *ctx)
{
    if (!ctx || !ctx->device.ok)
        return;
    CUcontext c = NULL;
    ctx->api->cuCtxPopCurrent(&c);
}

int stof__plan_settle(struct stof_context *ctx)
{
    int st = stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    const CUresult r = ctx->api->cuStreamSynchronize(NULL);
    stof__ctx_pop(ctx);
    if (r != CUDA_SUCCESS)
        return stof__cuda_fail(ctx, r, "cuStreamSynchronize (a plan's uploads)",
                               __FILE__, __LINE__);
    return STOF_OK;
}

stof_status stof_device_describe(stof_context *ctx, char *buf, size_t n,
                                 size_t *needed)
{
    if (needed)
        *needed = 0;
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, buf || n == 0,
                   "buf: NULL with n = %zu (pass n = 0 to ask for the size)",
                   n);
    if (!ctx->device.ok)
        return no_device(ctx);
    const stof_device *d = &ctx->device;
    char cc[16], arch[16], nv[16];
    snprintf(cc, sizeof(cc), "%d.%d", d->cc_major, d->cc_minor);
    snprintf(arch, sizeof(arch), "sm_%d%d", d->cc_major, d->cc_minor);
    snprintf(nv, sizeof(nv), "%d.%d", d->nvrtc_major, d->nvrtc_minor);
    json_t *o = json_pack(
        "{s:s, s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:I, s:i, s:o, s:s, s:s}",
        "name", d->name, "ordinal", d->ordinal, "cc", cc, "cc_major",
        d->cc_major, "cc_minor", d->cc_minor, "sm_count", d->sm_count,
        "smem_optin", d->max_smem_optin, "l2_bytes", d->l2_bytes,
        "total_mem", (json_int_t)d->total_mem, "driver_version",
        d->driver_version, "nvrtc_version",
        ctx->api->has_nvrtc ? json_string(nv) : json_null(), "arch", d->arch,
        "device_arch", arch);
    size_t len = 0;
    stof_status st = stof__json_out(o, buf, n, &len);
    if (needed)
        *needed = len;
    if (st == STOF_ERR_OUT_OF_MEMORY)
        return stof__fail(ctx, st, "out of memory describing the device");
    /* A size query (n = 0) is the protocol's first step, not an error
     * worth logging; the status and message are still recorded. */
    if (st == STOF_ERR_BUFFER_TOO_SMALL && n == 0)
        return stof__fail_quiet(ctx, st,
                                "buf: 0 bytes: the description needs %zu "
                                "plus the terminating NUL",
                                len);
    if (st == STOF_ERR_BUFFER_TOO_SMALL)
        return stof__fail(ctx, st,
                          "buf: %zu bytes are too few: the description "
                          "needs %zu plus the terminating NUL",
                          n, len);
    return stof__ok(ctx);
}
