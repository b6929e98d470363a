/*
 * gpu_backend.c - the search backend that compiles with NVRTC, and loads,
 * verifies and times candidates on the context's GPU. Verification runs
 * the candidate and the reference kernel on the same random inputs
 * (seeded) and compares them; timing takes the median of repeated runs
 * with the L2 cache flushed before each, so every run reads its inputs
 * from device memory as a real layer would.
 */
#include "gpu_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FLUSH_BYTES (256u << 20)

struct stof_gpu_backend {
    stof_context *ctx;
    stof_attention_desc desc;
    const stof_mask *mask;
    uint64_t seed;
    int reps;
    size_t nq, nk;        /* elements of the q/o and k/v allocations */
    CUdeviceptr q, k, v, o, ref, flush;
    CUevent e0, e1;
    uint16_t *h_out, *h_ref;
};

/* Elements reachable through a descriptor's strides for one tensor. */
static size_t extent(const int64_t st[3], int b, int h, int s, int d)
{
    return (size_t)((int64_t)(b - 1) * st[0] + (int64_t)(h - 1) * st[1] +
                    (int64_t)(s - 1) * st[2] + d);
}

/* Random fp16/bf16 values in [-amp, amp] from a splitmix64 stream. */
static void fill(uint16_t *x, size_t n, uint64_t *state, stof_dtype dt,
                 float amp)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        float f = ((float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * amp;
        x[i] = stof__f32_to_half(f, dt);
    }
}


void stof__gpu_backend_free(stof_gpu_backend **pb)
{
    if (!pb || !*pb)
        return;
    stof_gpu_backend *b = *pb;
    const stof_api *api = b->ctx->api;
    if (stof__ctx_push(b->ctx) == STOF_OK) {
        CUdeviceptr bufs[] = {b->q, b->k, b->v, b->o, b->ref, b->flush};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(*bufs); i++)
            if (bufs[i])
                api->cuMemFree(bufs[i]);
        if (b->e0)
            api->cuEventDestroy(b->e0);
        if (b->e1)
            api->cuEventDestroy(b->e1);
        stof__ctx_pop(b->ctx);
    }
    free(b->h_out);
    free(b->h_ref);
    free(b);
    *pb = NULL;
}

stof_status stof__gpu_backend_new(stof_context *ctx,
                                  const stof_attention_desc *d,
                                  const stof_mask *m, uint64_t seed, int reps,
                                  stof_gpu_backend **out)
{
    *out = NULL;
    stof_gpu_backend *b = calloc(1, sizeof(*b));
    if (!b)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory starting the search");
    b->ctx = ctx;
    b->desc = *d;
    b->mask = m;
    b->seed = seed;
    b->reps = reps > 0 ? reps : 15;
    b->nq = extent(d->q_stride, d->batch, d->heads, d->seq_q, d->head_dim);
    size_t no = extent(d->o_stride, d->batch, d->heads, d->seq_q, d->head_dim);
    if (no > b->nq)
        b->nq = no;
    b->nk = extent(d->k_stride, d->batch, d->heads, d->seq_k, d->head_dim);
    size_t nv = extent(d->v_stride, d->batch, d->heads, d->seq_k, d->head_dim);
    if (nv > b->nk)
        b->nk = nv;
    b->h_out = malloc(b->nq * 2);
    b->h_ref = malloc(b->nq * 2);
    uint16_t *hq = malloc(b->nq * 2), *hk = malloc(b->nk * 2),
             *hv = malloc(b->nk * 2);
    stof_status st = STOF_OK;
    if (!b->h_out || !b->h_ref || !hq || !hk || !hv) {
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                        "out of memory for the verification inputs");
        goto done;
    }
    uint64_t s = seed;
    fill(hq, b->nq, &s, d->dtype, 2.0f);
    fill(hk, b->nk, &s, d->dtype, 2.0f);
    fill(hv, b->nk, &s, d->dtype, 1.0f);
    if ((st = (stof_status)stof__ctx_push(ctx)) != STOF_OK)
        goto done;
    const stof_api *api = ctx->api;
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->q, b->nq * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->o, b->nq * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->ref, b->nq * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->k, b->nk * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->v, b->nk * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemcpyHtoD(b->q, hq, b->nq * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemcpyHtoD(b->k, hk, b->nk * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemcpyHtoD(b->v, hv, b->nk * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuEventCreate(&b->e0, CU_EVENT_DEFAULT));
    STOF_CU_GOTO(ctx, st, pop, api->cuEventCreate(&b->e1, CU_EVENT_DEFAULT));
    stof__ctx_pop(ctx);

    /* The reference output, once. */
    {
        stof_candidate ref = {.kind = STOF_KERNEL_REFERENCE};
        stof_plan *rp = NULL;
        st = stof__attention_plan_kernel(ctx, d, m, &ref, &rp);
        if (st != STOF_OK)
            goto done;
        if ((st = (stof_status)stof__ctx_push(ctx)) == STOF_OK) {
            CUresult r = api->cuMemsetD8(b->ref, 0xff, b->nq * 2);
            stof_status rs = stof_attention_run(
                rp, (void *)(uintptr_t)b->q, (void *)(uintptr_t)b->k,
                (void *)(uintptr_t)b->v, (void *)(uintptr_t)b->ref, NULL);
            if (r == CUDA_SUCCESS && rs == STOF_OK)
                r = api->cuCtxSynchronize();
            if (r == CUDA_SUCCESS && rs == STOF_OK)
                r = api->cuMemcpyDtoH(b->h_ref, b->ref, b->nq * 2);
            if (rs != STOF_OK)
                st = stof__fail(ctx, rs, "reference run: %s",
                                stof_plan_errmsg(rp));
            else if (r != CUDA_SUCCESS)
                st = (stof_status)stof__cuda_fail(ctx, r, "reference run",
                                                  __FILE__, __LINE__);
            stof__ctx_pop(ctx);
        }
        stof_plan_free(&rp);
    }
    goto done;
pop:
    stof__ctx_pop(ctx);
done:
    free(hq);
    free(hk);
    free(hv);
    if (st != STOF_OK)
        stof__gpu_backend_free(&b);
    *out = b;
    return st;
}

/* --- the backend's operations ------------------------------------------ */

static int gb_compile(void *user, const stof_candidate *c, void **art,
                      size_t *size, char *err, size_t errn)
{
    stof_gpu_backend *b = user;
    /* A private context: compiles run concurrently on pool threads and
     * must not share the caller's error state. */
    stof_context *tmp = calloc(1, sizeof(*tmp));
    if (!tmp) {
        snprintf(err, errn, "out of memory");
        return 1;
    }
    tmp->api = b->ctx->api;
    tmp->device = b->ctx->device;
    stof_status st = stof__kernel_compile(tmp, c, b->desc.head_dim,
                                          b->desc.dtype, art, size);
    if (st != STOF_OK)
        snprintf(err, errn, "%s", tmp->errmsg);
    free(tmp);
    return st != STOF_OK;
}

static int gb_load(void *user, const stof_candidate *c, const void *art,
                   size_t size, void **handle, char *err, size_t errn)
{
    stof_gpu_backend *b = user;
    stof_plan *p = NULL;
    stof_status st = stof__plan_from_cubin(b->ctx, &b->desc, b->mask, c, art,
                                           size, &p);
    if (st != STOF_OK) {
        snprintf(err, errn, "%s", stof_errmsg(b->ctx));
        return 1;
    }
    *handle = p;
    return 0;
}

static int gb_verify(void *user, void *handle, double *rel, char *err,
                     size_t errn)
{
    stof_gpu_backend *b = user;
    stof_plan *p = handle;
    const stof_api *api = b->ctx->api;
    const stof_attention_desc *d = &b->desc;
    *rel = INFINITY;
    if (stof__ctx_push(b->ctx) != STOF_OK) {
        snprintf(err, errn, "%s", stof_errmsg(b->ctx));
        return 1;
    }
    /* Poisoned output: 0xffff is NaN in fp16 and bf16. */
    CUresult r = api->cuMemsetD8(b->o, 0xff, b->nq * 2);
    stof_status st = STOF_OK;
    if (r == CUDA_SUCCESS)
        st = stof_attention_run(p, (void *)(uintptr_t)b->q,
                                (void *)(uintptr_t)b->k, (void *)(uintptr_t)b->v,
                                (void *)(uintptr_t)b->o, NULL);
    if (r == CUDA_SUCCESS && st == STOF_OK)
        r = api->cuCtxSynchronize();
    if (r == CUDA_SUCCESS && st == STOF_OK)
        r = api->cuMemcpyDtoH(b->h_out, b->o, b->nq * 2);
    stof__ctx_pop(b->ctx);
    if (st != STOF_OK || r != CUDA_SUCCESS) {
        const char *name = NULL;
        if (r != CUDA_SUCCESS)
            api->cuGetErrorName(r, &name);
        snprintf(err, errn, "run failed: %s",
                 st != STOF_OK ? stof_plan_errmsg(p) : name ? name : "?");
        return 1;
    }
    double num = 0.0, den = 0.0;
    for (int bi = 0; bi < d->batch; bi++)
        for (int h = 0; h < d->heads; h++)
            for (int i = 0; i < d->seq_q; i++) {
                size_t off = (size_t)((int64_t)bi * d->o_stride[0] +
                                      (int64_t)h * d->o_stride[1] +
                                      (int64_t)i * d->o_stride[2]);
                for (int e = 0; e < d->head_dim; e++) {
                    double g = stof__half_to_f32(b->h_out[off + e], d->dtype);
                    double w = stof__half_to_f32(b->h_ref[off + e], d->dtype);
                    if (!isfinite(g) || !isfinite(w))
                        return 0; /* *rel stays +inf: rejected */
                    num += (g - w) * (g - w);
                    den += w * w;
                }
            }
    *rel = den > 0.0 ? sqrt(num / den) : sqrt(num);
    return 0;
}

static int gb_time(void *user, void *handle, double *ms, char *err,
                   size_t errn)
{
    stof_gpu_backend *b = user;
    stof_plan *p = handle;
    const stof_api *api = b->ctx->api;
    float *t = malloc(sizeof(float) * (size_t)b->reps);
    if (!t || stof__ctx_push(b->ctx) != STOF_OK) {
        free(t);
        snprintf(err, errn, "cannot start timing");
        return 1;
    }
    void *q = (void *)(uintptr_t)b->q, *k = (void *)(uintptr_t)b->k,
         *v = (void *)(uintptr_t)b->v, *o = (void *)(uintptr_t)b->o;
    int rc = 0;
    /* The flush buffer is made at the first timing: a backend that only
     * verifies (a record's first use on this host) never needs it. */
    if (!b->flush && api->cuMemAlloc(&b->flush, FLUSH_BYTES) != CUDA_SUCCESS) {
        b->flush = 0;
        stof__ctx_pop(b->ctx);
        free(t);
        snprintf(err, errn, "cannot allocate the L2 flush buffer");
        return 1;
    }
    /* Warm-up. */
    for (int i = 0; i < 2 && !rc; i++)
        rc = stof_attention_run(p, q, k, v, o, NULL) != STOF_OK;
    for (int i = 0; i < b->reps && !rc; i++) {
        api->cuMemsetD8(b->flush, (unsigned char)i, FLUSH_BYTES);
        api->cuEventRecord(b->e0, NULL);
        rc = stof_attention_run(p, q, k, v, o, NULL) != STOF_OK;
        api->cuEventRecord(b->e1, NULL);
        if (!rc)
            rc = api->cuEventSynchronize(b->e1) != CUDA_SUCCESS ||
                 api->cuEventElapsedTime(&t[i], b->e0, b->e1) != CUDA_SUCCESS;
    }
    stof__ctx_pop(b->ctx);
    if (rc) {
        snprintf(err, errn, "a timed run failed: %s", stof_plan_errmsg(p));
        free(t);
        return 1;
    }
    /* Median (insertion sort: reps is small). */
    for (int i = 1; i < b->reps; i++)
        for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
            float x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    *ms = b->reps % 2 ? t[b->reps / 2]
                      : 0.5 * (t[b->reps / 2 - 1] + t[b->reps / 2]);
    free(t);
    return 0;
}

static void gb_unload(void *user, void *handle)
{
    (void)user;
    stof_plan *p = handle;
    stof_plan_free(&p);
}

stof_search_backend stof__gpu_backend_ops(stof_gpu_backend *b)
{
    stof_search_backend ops = {b, gb_compile, gb_load, gb_verify, gb_time,
                               gb_unload};
    return ops;
}
