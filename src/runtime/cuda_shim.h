/*
 * cuda_shim.h - the CUDA driver and NVRTC entry points stof uses, loaded at
 * run time with dlopen into one function table. Nothing links against
 * libcuda or libnvrtc, so the library works (minus the GPU) on machines
 * without a driver, and tests can swap the table to inject failures.
 */
#ifndef STOF_CUDA_SHIM_H
#define STOF_CUDA_SHIM_H

#include <cuda.h>
#include <nvrtc.h>

#define STOF__CU_FN(X)                                                         \
    X(cuInit, CUresult, (unsigned int))                                        \
    X(cuDriverGetVersion, CUresult, (int *))                                   \
    X(cuGetErrorName, CUresult, (CUresult, const char **))                     \
    X(cuGetErrorString, CUresult, (CUresult, const char **))                   \
    X(cuDeviceGetCount, CUresult, (int *))                                     \
    X(cuDeviceGet, CUresult, (CUdevice *, int))                                \
    X(cuDeviceGetName, CUresult, (char *, int, CUdevice))                      \
    X(cuDeviceGetAttribute, CUresult, (int *, CUdevice_attribute, CUdevice))   \
    X(cuDeviceTotalMem, CUresult, (size_t *, CUdevice))                        \
    X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice))             \
    X(cuDevicePrimaryCtxRelease, CUresult, (CUdevice))                         \
    X(cuCtxPushCurrent, CUresult, (CUcontext))                                 \
    X(cuCtxPopCurrent, CUresult, (CUcontext *))                                \
    X(cuCtxSynchronize, CUresult, (void))                                      \
    X(cuModuleLoadData, CUresult, (CUmodule *, const void *))                  \
    X(cuModuleUnload, CUresult, (CUmodule))                                    \
    X(cuModuleGetFunction, CUresult, (CUfunction *, CUmodule, const char *))   \
    X(cuFuncSetAttribute, CUresult, (CUfunction, CUfunction_attribute, int))   \
    X(cuFuncGetAttribute, CUresult, (int *, CUfunction_attribute, CUfunction)) \
    X(cuLaunchKernel, CUresult,                                                \
      (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, \
       unsigned, CUstream, void **, void **))                                  \
    X(cuMemAlloc, CUresult, (CUdeviceptr *, size_t))                           \
    X(cuMemFree, CUresult, (CUdeviceptr))                                      \
    X(cuMemGetInfo, CUresult, (size_t *, size_t *))                            \
    X(cuMemcpyHtoD, CUresult, (CUdeviceptr, const void *, size_t))             \
    X(cuMemcpyDtoH, CUresult, (void *, CUdeviceptr, size_t))                   \
    X(cuMemsetD8, CUresult, (CUdeviceptr, unsigned char, size_t))              \
    X(cuStreamCreate, CUresult, (CUstream *, unsigned int))                    \
    X(cuStreamDestroy, CUresult, (CUstream))                                   \
    X(cuStreamSynchronize, CUresult, (CUstream))                               \
    X(cuEventCreate, CUresult, (CUevent *, unsigned int))                      \
    X(cuEventDestroy, CUresult, (CUevent))                                     \
    X(cuEventRecord, CUresult, (CUevent, CUstream))                            \
    X(cuEventSynchronize, CUresult, (CUevent))                                 \
    X(cuEventElapsedTime, CUresult, (float *, CUevent, CUevent))              \
    X(cuStreamBeginCapture, CUresult, (CUstream, CUstreamCaptureMode))         \
    X(cuStreamEndCapture, CUresult, (CUstream, CUgraph *))                     \
    X(cuStreamIsCapturing, CUresult, (CUstream, CUstreamCaptureStatus *))      \
    X(cuGraphInstantiate, CUresult,                                            \
      (CUgraphExec *, CUgraph, unsigned long long))                            \
    X(cuGraphLaunch, CUresult, (CUgraphExec, CUstream))                        \
    X(cuGraphGetNodes, CUresult, (CUgraph, CUgraphNode *, size_t *))          \
    X(cuGraphExecDestroy, CUresult, (CUgraphExec))                             \
    X(cuGraphDestroy, CUresult, (CUgraph))

#define STOF__NVRTC_FN(X)                                                      \
    X(nvrtcVersion, nvrtcResult, (int *, int *))                               \
    X(nvrtcGetErrorString, const char *, (nvrtcResult))                        \
    X(nvrtcCreateProgram, nvrtcResult,                                         \
      (nvrtcProgram *, const char *, const char *, int, const char *const *,   \
       const char *const *))                                                   \
    X(nvrtcDestroyProgram, nvrtcResult, (nvrtcProgram *))                      \
    X(nvrtcCompileProgram, nvrtcResult, (nvrtcProgram, int, const char *const *)) \
    X(nvrtcGetProgramLogSize, nvrtcResult, (nvrtcProgram, size_t *))           \
    X(nvrtcGetProgramLog, nvrtcResult, (nvrtcProgram, char *))                 \
    X(nvrtcGetCUBINSize, nvrtcResult, (nvrtcProgram, size_t *))                \
    X(nvrtcGetCUBIN, nvrtcResult, (nvrtcProgram, char *))                      \
    X(nvrtcGetNumSupportedArchs, nvrtcResult, (int *))                         \
    X(nvrtcGetSupportedArchs, nvrtcResult, (int *))

/* The table. `has_cuda` / `has_nvrtc` say which half loaded; when a half is
 * missing its pointers are NULL and `cuda_why` / `nvrtc_why` say why. */
typedef struct stof_api {
    int has_cuda, has_nvrtc;
    char cuda_why[512], nvrtc_why[512];
    void *cuda_lib, *nvrtc_lib;
#define STOF__FN_PTR(name, ret, args) ret(*name) args;
    STOF__CU_FN(STOF__FN_PTR)
    STOF__NVRTC_FN(STOF__FN_PTR)
#undef STOF__FN_PTR
} stof_api;

/* The process-wide table, loaded on first use (thread-safe, never fails:
 * check has_cuda / has_nvrtc). The library names tried can be overridden
 * with the environment variables STOF_LIBCUDA and STOF_LIBNVRTC. */
const stof_api *stof__api(void);

/* For tests: use `api` instead of the loaded table from now on (NULL
 * restores the loaded one). Not thread-safe; call before opening contexts. */
void stof__api_override(const stof_api *api);

/* cuTensorMapEncodeTiled (CUDA 12+), for the TMA kernels. */
typedef CUresult (*stof_encode_tiled_fn)(
    CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
    const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* cuTensorMapEncodeTiled from the libcuda `api` loaded (or, when the table
 * was swapped, whichever libcuda the process already has); cached after
 * the first success. NULL when neither has it. */
stof_encode_tiled_fn stof__encode_tiled(const stof_api *api);

/* cuLaunchKernelEx and cuOccupancyMaxActiveClusters (CUDA 12+), for
 * kernels launched in clusters; like stof__encode_tiled, NULL when the
 * driver lacks them. */
typedef CUresult (*stof_launch_ex_fn)(const CUlaunchConfig *, CUfunction,
                                      void **, void **);
typedef CUresult (*stof_max_clusters_fn)(int *, CUfunction,
                                         const CUlaunchConfig *);
stof_launch_ex_fn stof__launch_ex(const stof_api *api);
stof_max_clusters_fn stof__max_clusters(const stof_api *api);

/* The id of the capture `stream` is in (cuStreamGetCaptureInfo_v2, CUDA
 * 11.3+; every capture has its own): 1 with *id set when the stream is
 * capturing and the driver says which capture, else 0. */
int stof__capture_id(const stof_api *api, CUstream stream,
                     unsigned long long *id);

/* Enumerating and loading a module's kernels without their names (CUDA
 * 12.4+: cuModuleGetFunctionCount, cuModuleEnumerateFunctions,
 * cuFuncGetName, cuFuncLoad), for preloading a database's modules; NULL
 * when the driver lacks one. */
typedef struct stof_module_enum {
    CUresult (*count)(unsigned int *, CUmodule);
    CUresult (*list)(CUfunction *, unsigned int, CUmodule);
    CUresult (*name)(const char **, CUfunction);
    CUresult (*load)(CUfunction);
} stof_module_enum;
/* 1 with all four entry points in *e, else 0. */
int stof__module_enum(const stof_api *api, stof_module_enum *e /* OUT */);

/* How a kernel is launched (stof__launch). */
typedef struct stof_launch_opts {
    unsigned cluster; /* CTAs a cluster along x (0 or 1: none) */
    int cooperative;  /* all CTAs resident at once */
    /* Programmatic dependent launch: the kernel may start while the
     * kernel before it in the stream is still running, so it must call
     * stof_grid_wait() (jit_templates/stof_common.cuh) in every CTA before
     * it touches global memory that kernel reads or writes. Only for such
     * kernels: 1, or STOF_PDL_IF_SM90 where the template is also compiled
     * for older GPUs (which have no such instruction: asked only when fn
     * was compiled for compute capability 9.0+, looked up only when PDL is
     * enabled). Ignored where stof__pdl_enabled() is 0 or the driver has
     * no cuLaunchKernelEx. */
    int pdl;
} stof_launch_opts;
#define STOF_PDL_IF_SM90 2

/* The configuration of such a launch (cfg points into at): a cluster of
 * `cluster` CTAs along x when above 1, cooperative, PDL, as given. Also
 * what occupancy queries of a launch take. */
void stof__launch_config(CUlaunchConfig *cfg, CUlaunchAttribute at[3],
                         unsigned gx, unsigned gy, unsigned gz,
                         unsigned threads, unsigned smem, CUstream stream,
                         unsigned cluster, int cooperative, int pdl);

/* Launch fn on a gx x gy x gz grid of `threads`-thread CTAs: cuLaunchKernel
 * when no option needs more, else cuLaunchKernelEx with the options'
 * attributes (CUDA_ERROR_NOT_SUPPORTED when a cluster or a cooperative
 * launch is asked and the driver lacks it). */
CUresult stof__launch(const stof_api *api, CUfunction fn, unsigned gx,
                      unsigned gy, unsigned gz, unsigned threads,
                      unsigned smem, CUstream stream, void **params,
                      const stof_launch_opts *o);

/* Whether launches may ask for programmatic dependent launch. STOF_PDL=1
 * or 0 in the environment (read once), or stof__pdl_set(1 or 0), decides
 * for every launch; otherwise (stof__pdl_set(-1) returns there) the
 * calling thread's scope does (stof__pdl_scope, 0 outside one): a layer
 * plan sets it around its launches to its own choice (stof_layer's pdl:
 * on for short batches, where an H200's stacks ran 1-5% faster with it,
 * off from 4096 tokens, where they ran up to 2.5% slower; bench/RESULTS.md,
 * 2026-11-28, eighth session). */
int stof__pdl_enabled(void);
void stof__pdl_set(int on);
/* What stof__pdl_enabled() would say in a scope of `choice`. */
int stof__pdl_for(int choice);
/* Set the calling thread's choice (0 or 1) for launches while the
 * environment does not decide; returns the previous one, to be restored. */
int stof__pdl_scope(int on);
/* A switch read once from the environment into *state (-1: not read
 * yet): 1 for "1", 0 for "0", else dflt (not negative); later calls
 * return it (or what a setter stored there). */
int stof__env_switch(_Atomic int *state, const char *name, int dflt);


struct stof_context;

/* Record a failed driver call: the message names the call, the CUDA error
 * name and text, file and line. Returns STOF_ERR_CUDA, or
 * STOF_ERR_OUT_OF_MEMORY for CUDA_ERROR_OUT_OF_MEMORY (device memory
 * exhausted: the message says so). */
int stof__cuda_fail(struct stof_context *ctx, CUresult r, const char *what,
                    const char *file, int line);

/* Check a driver call; on failure record it on `ctx` and return. */
#define STOF_CU(ctx, call)                                                     \
    do {                                                                       \
        CUresult stof_r_ = (call);                                             \
        if (stof_r_ != CUDA_SUCCESS)                                           \
            return (stof_status)stof__cuda_fail((ctx), stof_r_, #call,         \
                                                __FILE__, __LINE__);           \
    } while (0)

/* Like STOF_CU but jumps to `label` after recording, with `st` set. */
#define STOF_CU_GOTO(ctx, st, label, call)                                     \
    do {                                                                       \
        CUresult stof_r_ = (call);                                             \
        if (stof_r_ != CUDA_SUCCESS) {                                         \
            (st) = (stof_status)stof__cuda_fail((ctx), stof_r_, #call,         \
                                                __FILE__, __LINE__);           \
            goto label;                                                        \
        }                                                                      \
    } while (0)

/* Device and primary context (device.c). */
struct stof_device;
/* Initialise ctx->device for ordinal `ordinal`: cuInit, fingerprint, retain
 * the primary context, pick the NVRTC target arch. STOF_ERR_NO_DEVICE with a
 * reason when there is no driver, no device, or the ordinal is out of range.
 */
int stof__device_init(struct stof_context *ctx, int ordinal);
void stof__device_release(struct stof_context *ctx);
/* Make the device's primary context current on this thread (push) / undo
 * it (pop). Every entry point that touches the GPU brackets its work. */
int stof__ctx_push(struct stof_context *ctx);
void stof__ctx_pop(struct stof_context *ctx);
/* Plans upload and zero device memory on the legacy stream, where a
 * pageable copy returns once staged and a memset without waiting: wait for
 * that stream before a plan is handed out, so that a run on any stream (a
 * non-blocking one too, which the legacy stream does not order) reads what
 * the plan wrote. The context must be usable (pushes it itself). */
int stof__plan_settle(struct stof_context *ctx);

/* Run-time compilation (jit.c). Compile the embedded template `name` with
 * the given -D definitions (each "NAME=VALUE" or "NAME") for `arch`
 * ("sm_80", "sm_90", "sm_90a"; NULL = the context's device). On success
 * *cubin is malloc'd (caller frees) and *size set. Failure:
 * STOF_ERR_NVRTC with the compile log in the message, STOF_ERR_NO_DEVICE
 * when NVRTC cannot be loaded, STOF_ERR_NOT_FOUND for an unknown template.
 * Thread-safe when ctx is NULL (no message is recorded then). */
int stof__jit_compile(struct stof_context *ctx, const char *name,
                      const char *const *defines, int n_defines,
                      const char *arch, void **cubin /* OUT */,
                      size_t *size /* OUT */);

/* stof__module_load through the context's module cache: the same cubin
 * (its `size` bytes, by content) loaded before and not yet evicted gives
 * the same module (no load; a reference more), its kernel `fn_name` looked
 * up once and its shared memory limit raised when smem_bytes is above the
 * one set; size 0: loaded apart. Modules from here are given back with
 * stof__module_release, never cuModuleUnload; stof_close unloads what the
 * cache holds. */
int stof__module_load_shared(struct stof_context *ctx, const void *cubin,
                             size_t size, const char *fn_name,
                             size_t smem_bytes, CUmodule *mod, CUfunction *fn);
/* The same with the cubin's XXH3-64 known (hash; 0: computed here). With
 * cubin NULL (hash and size given) only a module the cache holds is used:
 * STOF_ERR_NOT_FOUND, with no message, when it holds none. */
int stof__module_load_shared_hashed(struct stof_context *ctx,
                                    const void *cubin, size_t size,
                                    uint64_t hash, const char *fn_name,
                                    size_t smem_bytes, CUmodule *mod,
                                    CUfunction *fn);

/* One reference more to module `mod` of the cache (given back with
 * stof__module_release): 1, or 0 when the cache does not hold it. */
int stof__module_retain(struct stof_context *ctx, CUmodule mod);

/* Give a module back: one reference less to a cached module (kept loaded
 * for the next plan until evicted or stof_close), or unloaded when it is
 * not the cache's. Needs nothing current; NULL does nothing. */
void stof__module_release(struct stof_context *ctx, CUmodule mod);

/* stof_close: unload every module of the cache. */
void stof__modcache_close(struct stof_context *ctx);

/* How many cubins the context's shared loads actually loaded (tests). */
long stof__module_shared_loads(const struct stof_context *ctx);

/* The most modules the cache holds. */
#define STOF_MODCACHE_MAX 256

/* Load a cubin into the module cache with every kernel it has (loaded, so
 * that a later stof__module_load_shared of the same cubin and a kernel of
 * it costs no load), held by nobody: evicted like any module no plan holds,
 * least recently used first. `en`: the driver's entry points
 * (stof__module_enum). STOF_OK with *loaded = 1 when loaded, 0 when the
 * cache had it already or every slot is held; else a status. */
int stof__module_preload(struct stof_context *ctx,
                         const stof_module_enum *en, const void *cubin,
                         size_t size, int *loaded /* OUT */);

/* How many modules the cache can take without evicting one a plan holds
 * (its size less the modules held). */
int stof__modcache_room(struct stof_context *ctx);

/* Whether the cache holds the module of this cubin (XXH3-64 and size) now
 * (it may be evicted before a load that counts on it:
 * stof__module_load_shared_hashed then says STOF_ERR_NOT_FOUND). */
int stof__module_cached(struct stof_context *ctx, uint64_t hash, size_t size);

/* Mark the cached module of this cubin (XXH3-64 and size) as just used,
 * so that it is evicted after those used before. */
void stof__module_touch(struct stof_context *ctx, uint64_t hash, size_t size);

/* How many cubins stof__module_preload loaded (tests). */
long stof__module_preloads(const struct stof_context *ctx);

/* Load a cubin into the device's primary context and get its kernel
 * `fn_name`, raising its dynamic shared memory limit to smem_bytes when
 * that is not 0. On failure nothing stays loaded. */
int stof__module_load(struct stof_context *ctx, const void *cubin,
                      const char *fn_name, size_t smem_bytes,
                      CUmodule *mod /* OUT */, CUfunction *fn /* OUT */);

/* Number of NVRTC compiles performed by this process (for tests that check
 * that a cache hit compiles nothing). */
long stof__jit_compile_count(void);

#endif /* STOF_CUDA_SHIM_H */
