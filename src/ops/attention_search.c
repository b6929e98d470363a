/*
 * attention_search.c - the attention operation of the search engine
 * (search.h): an attention problem's candidates (ranked by the cost
 * model), compiled with NVRTC, loaded as plans, verified against the
 * reference kernel on the same random inputs (seeded), and timed (median
 * of repeated runs with the L2 cache flushed before each, so every run
 * reads its inputs from device memory as a real layer would).
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "attention_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FLUSH_BYTES (256u << 20)

struct stof_attention_op {
    stof_context *ctx;
    stof_attention_desc desc;
    const stof_mask *mask;
    const stof_candidate *cands;
    int n;
    uint64_t seed;
    int reps;
    size_t nq, nk;        /* elements of the q/o and k/v allocations */
    size_t nb;            /* elements of the bias tensor (desc.bias), or 0 */
    CUdeviceptr q, k, v, o, ref, flush, bias;
    CUevent e0, e1;
    char name[96];
    /* No host copies: the inputs are made, the reference computed and the
     * outputs compared on the GPU (stof_ref_diff), over heads 0 ..
     * ref_heads - 1 of every sequence (every head for a spec mask). Mask
     * families (stof__attention_family_op_new) have no bit matrix; their
     * plans build their formats from `sample` (device data). */
    const stof_mask_family *fam;
    stof_mask_data sample;
    int ref_heads;
    CUmodule ref_mod;
    CUfunction f_diff;
    CUdeviceptr acc; /* 3 doubles (stof_ref_diff) */
    CUdeviceptr alibi; /* the family reference's ALiBi slopes, or 0 */
};

/* Run plan p on the op's inputs (the family's sample instance for a
 * family op, the op's bias when the problem has one) into o. */
static stof_status op_run_to(const stof_attention_op *b, stof_plan *p,
                             CUdeviceptr o)
{
    stof_run_args a = {
        .q = (const void *)(uintptr_t)b->q,
        .k = (const void *)(uintptr_t)b->k,
        .v = (const void *)(uintptr_t)b->v,
        .o = (void *)(uintptr_t)o,
        .data = b->fam ? &b->sample : NULL,
        .bias = b->nb ? (const void *)(uintptr_t)b->bias : NULL,
    };
    return stof_attention_run_ex(p, &a, NULL);
}

/* op_run_to the op's output buffer. */
static stof_status op_run(const stof_attention_op *b, stof_plan *p)
{
    return op_run_to(b, p, b->o);
}

/* Elements reachable through a descriptor's strides for one tensor. */
static size_t extent(const int64_t st[3], int b, int h, int s, int d)
{
    return (size_t)((int64_t)(b - 1) * st[0] + (int64_t)(h - 1) * st[1] +
                    (int64_t)(s - 1) * st[2] + d);
}

void stof__attention_op_free(stof_attention_op **pb)
{
    if (!pb || !*pb)
        return;
    stof_attention_op *b = *pb;
    const stof_api *api = b->ctx->api;
    if (stof__ctx_push(b->ctx) == STOF_OK) {
        CUdeviceptr bufs[] = {b->q,     b->k,   b->v,     b->o,  b->ref,
                              b->flush, b->acc, b->alibi, b->bias};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(*bufs); i++)
            if (bufs[i])
                api->cuMemFree(bufs[i]);
        if (b->ref_mod)
            api->cuModuleUnload(b->ref_mod);
        if (b->e0)
            api->cuEventDestroy(b->e0);
        if (b->e1)
            api->cuEventDestroy(b->e1);
        stof__ctx_pop(b->ctx);
    }
    free(b);
    *pb = NULL;
}

/* The verification inputs and the reference output. */
/* A new op for problem d: sizes, no buffers yet. */
static stof_attention_op *op_alloc(stof_context *ctx,
                                   const stof_attention_desc *d,
                                   uint64_t seed, int reps)
{
    stof_attention_op *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->ctx = ctx;
    b->desc = *d;
    b->seed = seed;
    b->reps = reps > 0 ? reps : 15;
    b->nq = extent(d->q_stride, d->batch, d->heads, d->seq_q, d->head_dim);
    size_t no = extent(d->o_stride, d->batch, d->heads, d->seq_q, d->head_dim);
    if (no > b->nq)
        b->nq = no;
    const int kvh = d->kv_heads > 0 ? d->kv_heads : d->heads;
    b->nk = extent(d->k_stride, d->batch, kvh, d->seq_k, d->head_dim);
    size_t nv = extent(d->v_stride, d->batch, kvh, d->seq_k, d->head_dim);
    if (nv > b->nk)
        b->nk = nv;
    b->nb = d->bias ? extent(d->bias_stride, d->batch, d->heads, d->seq_q,
                             d->seq_k)
                    : 0;
    b->ref_heads = d->heads;
    return b;
}

static CUresult ref_launch(const stof_api *api, CUfunction f, unsigned gx,
                           unsigned gy, unsigned threads, void **args)
{
    return api->cuLaunchKernel(f, gx, gy, 1, threads, 1, 1, 0, NULL, args,
                               NULL);
}

/* The verification inputs of op b from `seed`, on the GPU with
 * stof_ref_fill of the reference module `mod` (q, k uniform in [-2, 2], v
 * in [-1, 1], the bias, if any, in [-2, 2]): no host copies, so
 * problems with gigabytes of K and V do not spend seconds filling them.
 * The caller made the context current. */
static CUresult fill_inputs(const stof_api *api, CUmodule mod,
                            const stof_attention_op *b, uint64_t seed)
{
    CUfunction f_fill = NULL;
    CUresult r = api->cuModuleGetFunction(&f_fill, mod, "stof_ref_fill");
    const struct {
        CUdeviceptr x;
        size_t n;
        float amp;
    } in[4] = {{b->q, b->nq, 2.0f},
               {b->k, b->nk, 2.0f},
               {b->v, b->nk, 1.0f},
               {b->bias, b->nb, 2.0f}};
    for (int t = 0; t < 4 && r == CUDA_SUCCESS && in[t].n; t++) {
        int64_t cnt = (int64_t)in[t].n;
        unsigned long long sd = seed + 0x1000193ull * (unsigned)(t + 1);
        float amp = in[t].amp;
        void *args[] = {(void *)&in[t].x, &cnt, &sd, &amp};
        r = ref_launch(api, f_fill, 4096, 1, 256, args);
    }
    return r;
}

static stof_status op_inputs(stof_context *ctx, const stof_attention_desc *d,
                             const stof_mask *m, uint64_t seed, int reps,
                             stof_attention_op **out)
{
    *out = NULL;
    stof_attention_op *b = op_alloc(ctx, d, seed, reps);
    if (!b)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory starting the search");
    b->mask = m;
    stof_status st = STOF_OK;
    /* The reference module (also the reference plan's, compiled once per
     * context) fills the inputs. */
    stof_candidate rc = {.kind = STOF_KERNEL_REFERENCE};
    void *cubin = NULL;
    size_t size = 0;
    st = stof__kernel_cubin(ctx, &rc, d->head_dim, d->dtype, &cubin, &size);
    CUfunction f_fill = NULL; /* fill_inputs finds it again */
    if (st == STOF_OK)
        st = (stof_status)stof__module_load(ctx, cubin, "stof_ref_fill", 0,
                                            &b->ref_mod, &f_fill);
    free(cubin);
    if (st != STOF_OK)
        goto done;
    if ((st = (stof_status)stof__ctx_push(ctx)) != STOF_OK)
        goto done;
    const stof_api *api = ctx->api;
    STOF_CU_GOTO(ctx, st, pop,
                 api->cuModuleGetFunction(&b->f_diff, b->ref_mod,
                                          "stof_ref_diff"));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->q, b->nq * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->o, b->nq * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->ref, b->nq * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->k, b->nk * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->v, b->nk * 2));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->acc, 3 * sizeof(double)));
    if (b->nb)
        STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->bias, b->nb * 2));
    STOF_CU_GOTO(ctx, st, pop, fill_inputs(api, b->ref_mod, b, seed));
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
            stof_status rs = op_run_to(b, rp, b->ref);
            if (r == CUDA_SUCCESS && rs == STOF_OK)
                r = api->cuCtxSynchronize();
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
    if (st != STOF_OK)
        stof__attention_op_free(&b);
    *out = b;
    return st;
}

/* --- the operation ------------------------------------------------------ */

/* The kernel family stage 1 keeps top_k of: the kind, the persistent
 * wgmma kernel a family of its own (the model favours it everywhere, so
 * it would otherwise push the one-CTA-per-row-block kernels out). */
static int op_kind(void *user, int i)
{
    const stof_candidate *c = &((stof_attention_op *)user)->cands[i];
    return c->kind == STOF_KERNEL_WGMMA && c->wcfg.persist
               ? STOF_KERNEL_WGMMA_GATHER + 1
               : c->kind;
}

/* A wgmma candidate's tile shape and work split, all but its pipeline
 * depth (stages) where that leaves the CTAs an SM holds alone: the cost
 * model ranks such depths alike and they time within a few percent
 * (H100), so stage 1 times the best of each shape before a second depth
 * of one. mma.sync kernels keep the rank order (each its own key): their
 * depths differ more (a layer's mma.sync GEMM: 3 against 4 stages, 20%). */
static uint64_t op_shape(void *user, int i)
{
    const stof_candidate *c = &((stof_attention_op *)user)->cands[i];
    if (c->kind != STOF_KERNEL_WGMMA && c->kind != STOF_KERNEL_WGMMA_GATHER)
        return (uint64_t)i << 32; /* unlike any shape below (< 2^32) */
    const uint64_t v[] = {(uint64_t)c->kind,      (uint64_t)c->cfg.block_m,
                          (uint64_t)c->cfg.block_n, (uint64_t)c->cfg.warps,
                          (uint64_t)c->wcfg.persist, (uint64_t)c->group,
                          (uint64_t)c->splits,      (uint64_t)c->ctas_per_sm};
    uint64_t h = 0;
    for (size_t j = 0; j < sizeof(v) / sizeof(v[0]); j++)
        h = (h * 1000003u + (v[j] & 0xffffu)) & 0xffffffffu;
    return h;
}

static double op_model_ms(void *user, int i)
{
    return ((stof_attention_op *)user)->cands[i].predicted_ms;
}

static void op_describe(void *user, int i, char *buf, size_t n)
{
    const stof_candidate *c = &((stof_attention_op *)user)->cands[i];
    const char *k = stof__kernel_kind_name(c->kind);
    char split[24] = "";
    if (c->splits > 1)
        snprintf(split, sizeof(split), " split%d", c->splits);
    if (c->kind == STOF_KERNEL_REFERENCE)
        snprintf(buf, n, "%s", k);
    else if (c->group > 1)
        snprintf(buf, n, "%s %dx%d w%d s%d rows%%%d%s", k, c->cfg.block_m,
                 c->cfg.block_n, c->cfg.warps, c->cfg.stages, c->group, split);
    else
        snprintf(buf, n, "%s %dx%d w%d s%d%s%s%s", k, c->cfg.block_m,
                 c->cfg.block_n, c->cfg.warps, c->cfg.stages,
                 c->wcfg.persist ? " persistent" : "",
                 c->kind >= STOF_KERNEL_WGMMA && !c->wcfg.overlap
                     ? " no-overlap"
                     : "",
                 split);
}

static int op_compile(void *user, int i, void **art, size_t *size, char *err,
                      size_t errn)
{
    stof_attention_op *b = user;
    /* A private context: compiles run concurrently on pool threads and
     * must not share the caller's error state. */
    stof_context *tmp = calloc(1, sizeof(*tmp));
    if (!tmp) {
        snprintf(err, errn, "out of memory");
        return 1;
    }
    tmp->api = b->ctx->api;
    tmp->settings.log_fn = stof__log_discard;
    tmp->device = b->ctx->device;
    stof_status st = stof__kernel_compile(tmp, &b->cands[i], b->desc.head_dim,
                                          b->desc.dtype, art, size);
    if (st != STOF_OK)
        snprintf(err, errn, "%s", tmp->errmsg);
    free(tmp);
    return st != STOF_OK;
}

/* What the compiled kernel depends on: kind, template parameters, head_dim
 * and dtype (not the row grouping, which only changes the formats, nor the
 * split count, a launch argument), so problems of a batch warm-up share
 * their compiles. */
static uint64_t op_art_key(void *user, int i)
{
    const stof_attention_op *b = user;
    const stof_candidate *c = &b->cands[i];
    const int v[] = {c->kind,         c->cfg.block_m,   c->cfg.block_n,
                     c->cfg.warps,    c->cfg.stages,    c->wcfg.overlap,
                     c->wcfg.block_m, b->desc.head_dim, (int)b->desc.dtype,
                     c->splits > 1,   c->cfg.mods,      c->wcfg.mods,
                     c->wcfg.persist};
    uint64_t h = XXH3_64bits(v, sizeof(v));
    return h ? h : 1;
}

static int op_load(void *user, int i, const void *art, size_t size,
                   void **handle, char *err, size_t errn)
{
    stof_attention_op *b = user;
    stof_plan *p = NULL;
    stof_status st =
        b->fam ? stof__family_plan_from_cubin(b->ctx, &b->desc, b->fam,
                                              &b->cands[i], art, size, 0, &p)
               : stof__plan_from_cubin(b->ctx, &b->desc, b->mask,
                                       &b->cands[i], art, size, 0, &p);
    if (st != STOF_OK) {
        snprintf(err, errn, "%s", stof_errmsg(b->ctx));
        return 1;
    }
    *handle = p;
    return 0;
}

static int op_verify(void *user, void *handle, double *rel, char *err,
                     size_t errn)
{
    stof_attention_op *b = user;
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
        st = op_run(b, p);
    double acc[3] = {0, 0, 0};
    if (r == CUDA_SUCCESS && st == STOF_OK) {
        /* Compared on the GPU: only three numbers come back. */
        stof_attn_params prm;
        memset(&prm, 0, sizeof(prm));
        prm.o = b->o;
        prm.q = b->ref;
        memcpy(prm.o_stride, d->o_stride, sizeof(prm.o_stride));
        prm.batch = d->batch;
        prm.heads = b->ref_heads;
        prm.seq_q = d->seq_q;
        void *args[] = {&prm, &b->acc};
        r = api->cuMemsetD8(b->acc, 0, sizeof(acc));
        if (r == CUDA_SUCCESS)
            r = api->cuLaunchKernel(
                b->f_diff,
                (unsigned)((d->seq_q + 7) / 8 * d->batch * b->ref_heads), 1,
                1, 256, 1, 1, 0, NULL, args, NULL);
        if (r == CUDA_SUCCESS)
            r = api->cuMemcpyDtoH(acc, b->acc, sizeof(acc));
    }
    stof__ctx_pop(b->ctx);
    if (st != STOF_OK || r != CUDA_SUCCESS) {
        const char *name = NULL;
        if (r != CUDA_SUCCESS)
            api->cuGetErrorName(r, &name);
        snprintf(err, errn, "run failed: %s",
                 st != STOF_OK ? stof_plan_errmsg(p) : name ? name : "?");
        return 1;
    }
    if (acc[2] == 0.0) /* else a NaN or infinity: rejected */
        *rel = acc[1] > 0.0 ? sqrt(acc[0] / acc[1]) : sqrt(acc[0]);
    return 0;
}

static int op_time(void *user, void *handle, double *ms, char *err,
                   size_t errn)
{
    stof_attention_op *b = user;
    stof_plan *p = handle;
    const stof_api *api = b->ctx->api;
    float *t = malloc(sizeof(float) * (size_t)b->reps);
    if (!t || stof__ctx_push(b->ctx) != STOF_OK) {
        free(t);
        snprintf(err, errn, "cannot start timing");
        return 1;
    }
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
        rc = op_run(b, p) != STOF_OK;
    for (int i = 0; i < b->reps && !rc; i++) {
        api->cuMemsetD8(b->flush, (unsigned char)i, FLUSH_BYTES);
        api->cuEventRecord(b->e0, NULL);
        rc = op_run(b, p) != STOF_OK;
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

static void op_unload(void *user, void *handle)
{
    (void)user;
    stof_plan *p = handle;
    stof_plan_free(&p);
}

/* The search's operation table over op a (its cands and n set). */
static void op_table(stof_attention_op *a, stof_search_op *op)
{
    stof_search_op o = {.user = a,
                        .name = a->name,
                        .n = a->n,
                        .kind = op_kind,
                        .shape = op_shape,
                        .model_ms = op_model_ms,
                        .describe = op_describe,
                        .compile = op_compile,
                        .art_key = op_art_key,
                        .load = op_load,
                        .verify = op_verify,
                        .time = op_time,
                        .unload = op_unload,
                        .tolerance = 1e-2};
    *op = o;
}

/* Launch one of the reference module's kernels. */
stof_status stof__attention_family_op_new(
    stof_context *ctx, const stof_attention_desc *d,
    const stof_mask_family *fam, const stof_mask_data *sample,
    const stof_candidate *cands, int n, uint64_t seed, int reps,
    int ref_heads, stof_attention_op **out, stof_search_op *op)
{
    *out = NULL;
    stof_attention_op *b = op_alloc(ctx, d, seed, reps);
    if (!b)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory starting the search");
    b->fam = fam;
    b->sample = *sample;
    b->ref_heads = ref_heads < 1 || ref_heads > d->heads ? d->heads : ref_heads;
    /* A window per head: every head has its own mask, so every head is
     * checked (the reference kernel maps (b, head) to its formats). */
    if (stof__family_spec(fam)->uses & STOF_SPEC_USES_HEAD)
        b->ref_heads = d->heads;
    b->cands = cands;
    b->n = n;
    snprintf(b->name, sizeof(b->name), "attention %dx%dx%dx%dx%d %s family",
             d->batch, d->heads, d->seq_q, d->seq_k, d->head_dim,
             d->dtype == STOF_DTYPE_BF16 ? "bf16" : "fp16");
    stof_candidate rc = {.kind = STOF_KERNEL_REFERENCE};
    void *cubin = NULL;
    size_t size = 0;
    CUfunction f_ref = NULL;
    stof_mb_workspace pw;
    memset(&pw, 0, sizeof(pw));
    stof_status st = stof__kernel_cubin(ctx, &rc, d->head_dim, d->dtype,
                                        &cubin, &size);
    if (st == STOF_OK)
        st = (stof_status)stof__module_load(ctx, cubin,
                                            "stof_attn_reference_family", 0,
                                            &b->ref_mod, &f_ref);
    free(cubin);
    if (st == STOF_OK)
        st = stof__mb_workspace_heads(ctx, fam, d->batch, d->heads, d->seq_q,
                                      d->seq_k, 0, 0, &pw);
    if (st == STOF_OK && (st = (stof_status)stof__ctx_push(ctx)) == STOF_OK) {
        const stof_api *api = ctx->api;
        STOF_CU_GOTO(ctx, st, pop,
                     api->cuModuleGetFunction(&b->f_diff, b->ref_mod,
                                              "stof_ref_diff"));
        STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->q, b->nq * 2));
        STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->o, b->nq * 2));
        STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->ref, b->nq * 2));
        STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->k, b->nk * 2));
        STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->v, b->nk * 2));
        if (b->nb)
            STOF_CU_GOTO(ctx, st, pop,
                         api->cuMemAlloc(&b->bias, b->nb * 2));
        STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->acc, 3 * sizeof(double)));
        STOF_CU_GOTO(ctx, st, pop,
                     api->cuEventCreate(&b->e0, CU_EVENT_DEFAULT));
        STOF_CU_GOTO(ctx, st, pop,
                     api->cuEventCreate(&b->e1, CU_EVENT_DEFAULT));
        STOF_CU_GOTO(ctx, st, pop, fill_inputs(api, b->ref_mod, b, seed));
        /* The reference output over heads 0 .. ref_heads - 1 (the other
         * heads stay NaN and are not compared). */
        STOF_CU_GOTO(ctx, st, pop, api->cuMemsetD8(b->ref, 0xff, b->nq * 2));
        stof_attn_params prm;
        memset(&prm, 0, sizeof(prm));
        prm.q = b->q;
        prm.k = b->k;
        prm.v = b->v;
        prm.o = b->ref;
        memcpy(prm.q_stride, d->q_stride, sizeof(prm.q_stride));
        memcpy(prm.k_stride, d->k_stride, sizeof(prm.k_stride));
        memcpy(prm.v_stride, d->v_stride, sizeof(prm.v_stride));
        memcpy(prm.o_stride, d->o_stride, sizeof(prm.o_stride));
        prm.batch = d->batch;
        prm.heads = b->ref_heads;
        prm.seq_q = d->seq_q;
        prm.seq_k = d->seq_k;
        prm.scale = d->scale != 0.0f ? d->scale
                                     : 1.0f / sqrtf((float)d->head_dim);
        prm.kv_group = stof__kv_group(d);
        prm.softcap = d->softcap;
        if (d->alibi_slopes) {
            const size_t ab = sizeof(float) * (size_t)d->heads;
            STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&b->alibi, ab));
            STOF_CU_GOTO(ctx, st, pop,
                         api->cuMemcpyHtoD(b->alibi, d->alibi_slopes, ab));
            prm.alibi = b->alibi;
        }
        prm.bias = b->bias;
        memcpy(prm.bias_stride, d->bias_stride, sizeof(prm.bias_stride));
        stof_mb_data md;
        stof__family_mb_data(sample, &md);
        if (pw.n_seq) { /* packed: the clamped offsets, which it reads */
            stof_mb_kernels mk;
            st = stof__mb_load(ctx, &mk);
            if (st == STOF_OK) {
                st = stof__mb_prepare(&mk, &pw, &md, NULL, api);
                stof__mb_unload(ctx, &mk);
            }
            if (st != STOF_OK) {
                stof__fail(ctx, st, "preparing the packed offsets failed");
                goto pop;
            }
        }
        st = stof__mb_launch_with(
            f_ref, &prm, &pw, &md,
            (unsigned)((d->seq_q + REF_WARPS - 1) / REF_WARPS * d->batch *
                       b->ref_heads),
            1, 32 * REF_WARPS, NULL, api);
        if (st != STOF_OK)
            stof__fail(ctx, st, "launching the family reference failed");
        else
            STOF_CU_GOTO(ctx, st, pop, api->cuCtxSynchronize());
    pop:
        stof__ctx_pop(ctx);
    }
    stof__mb_workspace_free(ctx, &pw);
    if (st != STOF_OK) {
        stof__attention_op_free(&b);
        return st;
    }
    *out = b;
    if (op)
        op_table(b, op);
    return STOF_OK;
}

stof_status stof__attention_op_new(stof_context *ctx,
                                   const stof_attention_desc *d,
                                   const stof_mask *m,
                                   const stof_candidate *cands, int n,
                                   uint64_t seed, int reps,
                                   stof_attention_op **out,
                                   stof_search_op *op)
{
    stof_status st = op_inputs(ctx, d, m, seed, reps, out);
    if (st != STOF_OK)
        return st;
    stof_attention_op *a = *out;
    a->cands = cands;
    a->n = n;
    snprintf(a->name, sizeof(a->name), "attention %dx%dx%dx%dx%d %s",
             d->batch, d->heads, d->seq_q, d->seq_k, d->head_dim,
             d->dtype == STOF_DTYPE_BF16 ? "bf16" : "fp16");
    if (op)
        op_table(a, op);
    return STOF_OK;
}

int stof__attention_op_check(stof_attention_op *a, const stof_plan *p,
                             double *rel_err, char *err, size_t errn)
{
    /* The plan's kernel, formats and device data, launched for the op's
     * descriptor: every launch reads batch, heads and strides from it. */
    stof_plan tmp = *p;
    tmp.desc = a->desc;
    return op_verify(a, &tmp, rel_err, err, errn);
}
