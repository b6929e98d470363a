/*
 * attention_run.c - running a plan (stof_attention_run and its _lse,
 * _family and _ex forms): the checks of a run's arguments and instance
 * data, the family format built on the GPU from each run's data or reused
 * (STOF_RUN_SAME_DATA, capture-aware), then the plan's kernels
 * (attention_launch.c). Runs report errors through the plan
 * (stof_plan_errmsg), as they may happen on threads other than the
 * context's.
 */
#include "attention_int.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static stof_status plan_fail(stof_plan *p, stof_status st, const char *fmt,
                             ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static stof_status plan_fail(stof_plan *p, stof_status st, const char *fmt,
                             ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->errmsg, sizeof(p->errmsg), fmt, ap);
    va_end(ap);
    return st;
}

static stof_status run_impl(stof_plan *p, const stof_mask_data *data,
                            const void *q, const void *k, const void *v,
                            void *o, float *lse, const void *bias,
                            uint32_t flags, void *stream);
static stof_status run_family_checks(stof_plan *p, const stof_mask_data *data,
                                     const char *fn);

stof_status stof_attention_run(stof_plan *p, const void *q, const void *k,
                               const void *v, void *o, void *stream)
{
    if (p && p->n_seq)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "stof_attention_run: a packed plan runs with "
                         "stof_attention_run_family and its cu_seqlens");
    return run_impl(p, NULL, q, k, v, o, NULL, NULL, 0, stream);
}

stof_status stof_attention_run_lse(stof_plan *p, const stof_mask_data *data,
                                   const void *q, const void *k, const void *v,
                                   void *o, float *lse, void *stream)
{
    if (!p)
        return STOF_ERR_INVALID_ARGUMENT;
    if (!lse || (uintptr_t)lse % 4u)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "stof_attention_run_lse: lse is %s",
                         lse ? "not 4-byte aligned" : "NULL");
    if (data && !p->family)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "stof_attention_run_lse: instance data is for plans "
                         "of stof_attention_plan_family");
    stof_status st = p->family
                         ? run_family_checks(p, data, "stof_attention_run_lse")
                         : STOF_OK;
    return st != STOF_OK ? st
                         : run_impl(p, data, q, k, v, o, lse, NULL, 0, stream);
}

stof_status stof_attention_run_family(stof_plan *p, const stof_mask_data *data,
                                      const void *q, const void *k,
                                      const void *v, void *o, void *stream)
{
    if (!p)
        return STOF_ERR_INVALID_ARGUMENT;
    stof_status st = run_family_checks(p, data, "stof_attention_run_family");
    return st != STOF_OK ? st
                         : run_impl(p, data, q, k, v, o, NULL, NULL, 0, stream);
}

stof_status stof_attention_run_ex(stof_plan *p, const stof_run_args *a,
                                  void *stream)
{
    static const char fn[] = "stof_attention_run_ex";
    if (!p)
        return STOF_ERR_INVALID_ARGUMENT;
    if (!a)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT, "%s: args is NULL",
                         fn);
    for (size_t i = 0; i < sizeof(a->reserved) / sizeof(*a->reserved); i++)
        if (a->reserved[i])
            return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                             "%s: args.reserved[%zu] is not NULL", fn, i);
    if (a->reserved_u)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "%s: args.reserved_u is not 0", fn);
    if (a->flags & ~STOF_RUN_SAME_DATA)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "%s: args.flags has unknown bits 0x%x", fn,
                         (unsigned)(a->flags & ~STOF_RUN_SAME_DATA));
    if ((a->flags & STOF_RUN_SAME_DATA) && !p->family)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "%s: STOF_RUN_SAME_DATA is for plans of "
                         "stof_attention_plan_family", fn);
    if (a->lse && (uintptr_t)a->lse % 4u)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "%s: lse is not 4-byte aligned", fn);
    if (a->data && !p->family)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "%s: instance data is for plans of "
                         "stof_attention_plan_family",
                         fn);
    stof_status st = p->family ? run_family_checks(p, a->data, fn) : STOF_OK;
    return st != STOF_OK ? st
                         : run_impl(p, a->data, a->q, a->k, a->v, a->o,
                                    a->lse, a->bias, a->flags, stream);
}

/* The checks of a family run's plan and instance data (fn: the entry
 * point, for messages). */
static stof_status run_family_checks(stof_plan *p, const stof_mask_data *data,
                                     const char *fn)
{
    if (!p->family)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "%s: the plan was not made by "
                         "stof_attention_plan_family",
                         fn);
    if (data) {
        for (size_t i = 0; i < sizeof(data->reserved); i++)
            if (data->reserved[i])
                return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                                 "%s: stof_mask_data.reserved[%zu] is not "
                                 "zero",
                                 fn, i);
        if (data->doc_stride != 0 && data->doc_stride < p->desc.seq_k)
            return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                             "%s: doc_stride = %lld is below seq_k = %d", fn,
                             (long long)data->doc_stride, p->desc.seq_k);
        if (!p->n_seq && (data->cu_seqlens_q || data->cu_seqlens_k))
            return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                             "%s: cu_seqlens are set but the plan is not of "
                             "the packed layout",
                             fn);
        if (p->n_seq && (data->q_len || data->k_len))
            return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                             "%s: a packed plan takes its lengths from "
                             "cu_seqlens: leave q_len and k_len NULL",
                             fn);
        if (data->bitmap_stride < 0 ||
            (data->bitmap_words != 0 &&
             data->bitmap_words < (p->desc.seq_k + 31) / 32))
            return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                             "%s: bitmap_words = %d (at least ceil(seq_k / "
                             "32) = %d, or 0), bitmap_stride = %lld (>= 0)",
                             fn, (int)data->bitmap_words,
                             (p->desc.seq_k + 31) / 32,
                             (long long)data->bitmap_stride);
        /* (as stof_mask_data_check has it: padded sequences' bitmaps must
         * not overlap; a packed one's rows are device data) */
        const int64_t bw = data->bitmap_words ? data->bitmap_words
                                              : (p->desc.seq_k + 31) / 32;
        if (!p->n_seq && data->bitmap_stride != 0 &&
            data->bitmap_stride < (int64_t)p->desc.seq_q * bw)
            return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                             "%s: bitmap_stride = %lld is below seq_q x "
                             "bitmap_words = %lld (0 shares one bitmap)",
                             fn, (long long)data->bitmap_stride,
                             (long long)p->desc.seq_q * bw);
        if (data->total_q < 0 || data->total_q > p->desc.seq_q ||
            data->total_k < 0 || data->total_k > p->desc.seq_k)
            return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                             "%s: total_q = %d, total_k = %d: expected 0..%d "
                             "and 0..%d (the plan's rows)",
                             fn, (int)data->total_q, (int)data->total_k,
                             p->desc.seq_q, p->desc.seq_k);
    }
    if (p->n_seq && !(data && data->cu_seqlens_q))
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "%s: a packed plan needs cu_seqlens_q (device "
                         "memory, %d + 1 offsets)",
                         fn, p->n_seq);
    return STOF_OK;
}

_Static_assert(sizeof(stof_run_args) == 12 * sizeof(void *) &&
                   offsetof(stof_run_args, flags) == 7 * sizeof(void *),
               "stof_run_args' layout is part of the ABI (Python mirrors it)");

/* Whether `stream` is being captured into a CUDA graph: 1, 0, or -1 when
 * the driver cannot say (the format is then built). */
static int stream_capturing(const stof_api *api, void *stream)
{
    CUstreamCaptureStatus cs;
    if (api->cuStreamIsCapturing((CUstream)stream, &cs) != CUDA_SUCCESS)
        return -1;
    return cs == CU_STREAM_CAPTURE_STATUS_NONE     ? 0
           : cs == CU_STREAM_CAPTURE_STATUS_ACTIVE ? 1
                                                   : -1;
}

/* Whether a family run may use the plan's last format: asked to
 * (STOF_RUN_SAME_DATA), one was built, the instance data's struct (its
 * device pointers and values) is the one that built it, and the build
 * happened where this run happens: a captured run reuses only a build of
 * the same capture (the graph then holds both, in order; a build in
 * another graph runs only when that graph does), known by the driver's
 * capture id (capture_id: 0 when it cannot say, and nothing is reused);
 * an eager run reuses only an eager build, and never once the plan has
 * been captured (a replay rewrites the format with the graph's data,
 * unseen here). */
static int format_reusable(const stof_plan *p, const stof_mask_data *data,
                           uint32_t flags, int capturing,
                           unsigned long long capture_id)
{
    if (!(flags & STOF_RUN_SAME_DATA) || !p->fmt_valid || capturing < 0)
        return 0;
    if (capturing ? !p->fmt_captured || !capture_id ||
                        p->fmt_capture_id != capture_id
                  : p->fmt_captured || p->ever_captured)
        return 0;
    stof_mask_data none;
    memset(&none, 0, sizeof(none));
    return memcmp(data ? data : &none, &p->fmt_data, sizeof(none)) == 0;
}

static stof_status run_impl(stof_plan *p, const stof_mask_data *data,
                            const void *q, const void *k, const void *v,
                            void *o, float *lse, const void *bias,
                            uint32_t flags, void *stream)
{
    const CUdeviceptr dl = (CUdeviceptr)(uintptr_t)lse;
    if (!p)
        return STOF_ERR_INVALID_ARGUMENT;
    if (p->desc.bias && !bias)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "the plan adds a bias tensor (desc.bias = 1): run "
                         "it with stof_attention_run_ex and args.bias");
    if (!p->desc.bias && bias)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "stof_attention_run_ex: args.bias is set but the "
                         "plan was made without one (desc.bias = 0)");
    if ((uintptr_t)bias % 16u)
        return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                         "stof_attention_run_ex: args.bias is not 16-byte "
                         "aligned");
    const void *ptrs[4] = {q, k, v, o};
    static const char *const names[4] = {"q", "k", "v", "o"};
    for (int i = 0; i < 4; i++) {
        if (!ptrs[i])
            return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                             "stof_attention_run: %s is NULL", names[i]);
        if ((uintptr_t)ptrs[i] % 16u)
            return plan_fail(p, STOF_ERR_INVALID_ARGUMENT,
                             "stof_attention_run: %s is not 16-byte aligned",
                             names[i]);
    }
    const stof_api *api = p->ctx->api;
    CUcontext pctx = p->ctx->device.pctx;
    CUresult r = api->cuCtxPushCurrent(pctx);
    if (r != CUDA_SUCCESS)
        return plan_fail(p, STOF_ERR_CUDA, "stof_attention_run: %s",
                         "cannot make the device's primary context current");
    stof_status st = STOF_OK;
    const int capturing = p->family ? stream_capturing(api, stream) : 0;
    unsigned long long capture_id = 0;
    if (capturing == 1 &&
        !stof__capture_id(api, (CUstream)stream, &capture_id))
        capture_id = 0;
    if (p->family &&
        !format_reusable(p, data, flags, capturing, capture_id)) {
        p->fmt_valid = 0;
        if ((st = stof__attention_family_build(p, data, (CUstream)stream)) !=
            STOF_OK) {
            CUcontext popped;
            api->cuCtxPopCurrent(&popped);
            return plan_fail(p, st, "%s", "stof_attention_run: launching the "
                                          "format builder failed");
        }
        memset(&p->fmt_data, 0, sizeof(p->fmt_data));
        if (data)
            memcpy(&p->fmt_data, data, sizeof(p->fmt_data));
        p->fmt_valid = 1;
        p->fmt_captured = capturing == 1;
        p->fmt_capture_id = capture_id;
        p->ever_captured |= capturing == 1;
    }
    st = stof__plan_launch(p, data, (CUdeviceptr)(uintptr_t)q,
                           (CUdeviceptr)(uintptr_t)k, (CUdeviceptr)(uintptr_t)v,
                           (CUdeviceptr)(uintptr_t)o, dl,
                           (CUdeviceptr)(uintptr_t)bias, (CUstream)stream,
                           &r);
    CUcontext popped;
    api->cuCtxPopCurrent(&popped);
    if (st != STOF_OK) {
        const char *name = NULL;
        if (r == CUDA_SUCCESS || !api->cuGetErrorName ||
            api->cuGetErrorName(r, &name) != CUDA_SUCCESS)
            name = stof_status_str(st);
        return plan_fail(p, st, "stof_attention_run: kernel launch failed: %s",
                         name);
    }
    p->errmsg[0] = '\0';
    return STOF_OK;
}

int stof__plan_is_family(const stof_plan *p)
{
    return p && p->family;
}

const char *stof__plan_key(const stof_plan *p)
{
    return p ? p->key : "";
}

const char *stof_plan_errmsg(const stof_plan *p)
{
    return p ? p->errmsg : "plan is NULL";
}
