/*
 * mask_build.c - host side of the GPU format builder (mask_build.h,
 * jit_templates/mask_build.cu).
 */
#include "mask_build.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Mirrors struct stof_mb_params in jit_templates/mask_build.cu (same field
 * order and types). */
typedef struct stof_mb_params {
    CUdeviceptr prog;
    int n_prog;
    int batch, seq_q, seq_k;
    int block_m, block_n, n_rb, n_cb, bwpr;
    CUdeviceptr q_len, k_len, q_offset, prefix, doc_id;
    int64_t doc_stride;
    CUdeviceptr doc_lo, doc_hi;
    CUdeviceptr cls, cnt, row_ptr, col_idx, kind, bitmap_idx, bitmaps;
    int64_t tile_cap;
    CUdeviceptr stats;
    CUdeviceptr tslot;
    int64_t pool_cap;
    CUdeviceptr seed;
    CUdeviceptr cu_q, cu_k, pk;
    int n_seq, bitmap_words;
    CUdeviceptr bitmap;
    int64_t bitmap_stride;
    CUdeviceptr head_window;
    int heads_data, row_one;
} stof_mb_params;
_Static_assert(sizeof(stof_mb_params) == 272,
               "stof_mb_params must match mask_eval.cuh");

#define MB_THREADS 256
#define MB_SCAN_THREADS 1024
#define MB_SEQS_THREADS 1024
#define MB_MAX_TILE_WORDS 2048

static size_t align256(size_t n)
{
    return (n + 255u) & ~(size_t)255u;
}

int stof__mb_leaf_defines(char (*buf)[48], const char **defs)
{
    /* The leaf kinds as the host numbers them. */
    static const struct {
        const char *name;
        int v;
    } kinds[] = {
        {"MB_LEAF_DENSE", STOF_LEAF_DENSE},
        {"MB_LEAF_NONE", STOF_LEAF_NONE},
        {"MB_LEAF_CAUSAL", STOF_LEAF_CAUSAL},
        {"MB_LEAF_SLIDING", STOF_LEAF_SLIDING},
        {"MB_LEAF_CAUSAL_SLIDING", STOF_LEAF_CAUSAL_SLIDING},
        {"MB_LEAF_DILATED", STOF_LEAF_DILATED},
        {"MB_LEAF_LONGFORMER", STOF_LEAF_LONGFORMER},
        {"MB_LEAF_BIGBIRD", STOF_LEAF_BIGBIRD},
        {"MB_LEAF_STRIDED", STOF_LEAF_STRIDED},
        {"MB_LEAF_DOCS", STOF_LEAF_DOCS},
        {"MB_LEAF_PREFIX", STOF_LEAF_PREFIX},
        {"MB_LEAF_BITMAP", STOF_LEAF_BITMAP},
        {"MB_LEAF_HEAD_SLIDING", STOF_LEAF_HEAD_SLIDING},
        {"MB_LEAF_HEAD_CAUSAL_SLIDING", STOF_LEAF_HEAD_CAUSAL_SLIDING},
    };
    _Static_assert(sizeof(kinds) / sizeof(kinds[0]) == STOF_MB_N_LEAF_DEFINES,
                   "STOF_MB_N_LEAF_DEFINES");
    for (int i = 0; i < STOF_MB_N_LEAF_DEFINES; i++) {
        snprintf(buf[i], 48, "%s=%d", kinds[i].name, kinds[i].v);
        defs[i] = buf[i];
    }
    return STOF_MB_N_LEAF_DEFINES;
}

/* stof_close's hook: unload the context's builder module. */
static void mb_close(stof_context *ctx)
{
    stof_mb_kernels *k = ctx->mb_kernels;
    if (k && k->module && stof__ctx_push(ctx) == STOF_OK) {
        ctx->api->cuModuleUnload(k->module);
        stof__ctx_pop(ctx);
    }
    free(k);
    ctx->mb_kernels = NULL;
}

static stof_status mb_load_module(stof_context *ctx, stof_mb_kernels *k);

stof_status stof__mb_load(stof_context *ctx, stof_mb_kernels *k)
{
    memset(k, 0, sizeof(*k));
    if (!ctx->mb_kernels) {
        stof_mb_kernels *own = calloc(1, sizeof(*own));
        if (!own)
            return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
        stof_status st = mb_load_module(ctx, own);
        if (st != STOF_OK) {
            free(own);
            return st;
        }
        own->shared = 1;
        ctx->mb_kernels = own;
        ctx->mb_close = mb_close;
    }
    *k = *(const stof_mb_kernels *)ctx->mb_kernels;
    return STOF_OK;
}

/* Compile (once per context) and load the builder's module into k. */
static stof_status mb_load_module(stof_context *ctx, stof_mb_kernels *k)
{
    memset(k, 0, sizeof(*k));
    char buf[STOF_MB_N_LEAF_DEFINES][48];
    const char *defs[STOF_MB_N_LEAF_DEFINES];
    const int N_KINDS = stof__mb_leaf_defines(buf, defs);
    if (!ctx->mb_cubin) {
        void *cubin = NULL;
        size_t size = 0;
        stof_status cs = (stof_status)stof__jit_compile(
            ctx, "mask_build.cu", defs, N_KINDS, NULL, &cubin, &size);
        if (cs != STOF_OK)
            return cs;
        ctx->mb_cubin = cubin;
        ctx->mb_cubin_size = size;
    }
    stof_status st = (stof_status)stof__module_load(
        ctx, ctx->mb_cubin, "stof_mb_classify", 0, &k->module, &k->classify);
    if (st != STOF_OK)
        return st;
    if ((st = (stof_status)stof__ctx_push(ctx)) != STOF_OK) {
        stof__mb_unload(ctx, k);
        return st;
    }
    const stof_api *api = ctx->api;
    CUresult r = api->cuModuleGetFunction(&k->scan, k->module, "stof_mb_scan");
    if (r == CUDA_SUCCESS)
        r = api->cuModuleGetFunction(&k->fill, k->module, "stof_mb_fill");
    if (r == CUDA_SUCCESS)
        r = api->cuModuleGetFunction(&k->docs, k->module, "stof_mb_docs");
    if (r == CUDA_SUCCESS)
        r = api->cuModuleGetFunction(&k->seqs, k->module, "stof_mb_seqs");
    if (r == CUDA_SUCCESS)
        r = api->cuModuleGetFunction(&k->rw_or, k->module, "stof_mb_rw_or");
    if (r == CUDA_SUCCESS)
        r = api->cuModuleGetFunction(&k->rw_keys, k->module,
                                     "stof_mb_rw_keys");
    if (r == CUDA_SUCCESS)
        r = api->cuModuleGetFunction(&k->rw_bits, k->module,
                                     "stof_mb_rw_bits");
    if (r == CUDA_SUCCESS)
        r = api->cuModuleGetFunction(&k->rw_tiles, k->module,
                                     "stof_mb_rw_tiles");
    stof__ctx_pop(ctx);
    if (r != CUDA_SUCCESS) {
        st = (stof_status)stof__cuda_fail(ctx, r, "cuModuleGetFunction",
                                          __FILE__, __LINE__);
        stof__mb_unload(ctx, k);
    }
    return st;
}

void stof__mb_unload(stof_context *ctx, stof_mb_kernels *k)
{
    if (k->module && !k->shared && stof__ctx_push(ctx) == STOF_OK) {
        ctx->api->cuModuleUnload(k->module);
        stof__ctx_pop(ctx);
    }
    memset(k, 0, sizeof(*k));
}

int64_t stof__mb_pool_bound(const int32_t *prog, int n, int n_rb, int n_cb,
                            int block_m, int block_n)
{
    const int64_t all = (int64_t)n_rb * n_cb;
    /* The lines of the length box and of the padded last tiles. */
    int64_t bound = 2 * ((int64_t)n_rb + n_cb);
    /* A diagonal line crosses at most ceil(block_m / block_n) + 1 tiles of
     * a row block (its boundary keys are block_m consecutive values). */
    const int64_t diag = (int64_t)n_rb * ((block_m + block_n - 1) / block_n + 2);
    for (int i = 0; i < n && bound < all; i++) {
        const int32_t *nd = prog + 4 * i;
        if (nd[0] != 0) /* an operator: its partial tiles are its leaves' */
            continue;
        switch (nd[1]) {
        case STOF_LEAF_DENSE:
        case STOF_LEAF_NONE:
            break;
        case STOF_LEAF_CAUSAL:
            bound += diag;
            break;
        case STOF_LEAF_SLIDING:
        case STOF_LEAF_CAUSAL_SLIDING:
        case STOF_LEAF_HEAD_SLIDING:
        case STOF_LEAF_HEAD_CAUSAL_SLIDING:
            bound += 2 * diag;
            break;
        case STOF_LEAF_DILATED:
            bound += nd[3] == 1 ? 2 * diag : all;
            break;
        case STOF_LEAF_LONGFORMER:
            bound += 2 * diag + n_rb + n_cb;
            break;
        case STOF_LEAF_PREFIX:
            bound += n_rb;
            break;
        default: /* strided columns, documents, bitmaps: any tile */
            bound = all;
            break;
        }
    }
    return bound < all ? bound : all;
}

/* Allocate ws->mem (bytes), upload the program (n nodes) at offset 0 and
 * zero the statistics at o_stats. */
static stof_status mb_alloc(stof_context *ctx, stof_mb_workspace *ws,
                            const int32_t *prog, int n, size_t o_stats,
                            size_t bytes)
{
    stof_status st = (stof_status)stof__ctx_push(ctx);
    if (st != STOF_OK)
        return st;
    const stof_api *api = ctx->api;
    CUdeviceptr mem = 0;
    STOF_CU_GOTO(ctx, st, done, api->cuMemAlloc(&mem, bytes));
    STOF_CU_GOTO(ctx, st, done, api->cuMemcpyHtoD(mem, prog, (size_t)n * 16u));
    STOF_CU_GOTO(ctx, st, done,
                 api->cuMemsetD8(mem + o_stats, 0, STOF_MB_STATS * 8));
    ws->mem = mem;
    ws->bytes = bytes;
    ws->prog = mem;
    ws->stats = mem + o_stats;
    mem = 0;
done:
    if (mem)
        api->cuMemFree(mem);
    stof__ctx_pop(ctx);
    return st;
}

static stof_status workspace_new(stof_context *ctx,
                                 const stof_mask_family *fam, int batch,
                                 int n_seq, int seq_q, int seq_k, int block_m,
                                 int block_n, stof_mb_workspace *ws);

stof_status stof__mb_workspace_new(stof_context *ctx,
                                   const stof_mask_family *fam, int batch,
                                   int seq_q, int seq_k, int block_m,
                                   int block_n, stof_mb_workspace *ws)
{
    const int n_seq = stof__family_n_seq(fam);
    memset(ws, 0, sizeof(*ws));
    STOF_CHECK_ARG(ctx, n_seq == 0 || (batch == 1 && n_seq < (1 << 24)),
                   "GPU format builder: %d packed sequences in a batch of %d",
                   n_seq, batch);
    return workspace_new(ctx, fam, batch, n_seq, seq_q, seq_k, block_m,
                         block_n, ws);
}

stof_status stof__mb_workspace_heads(stof_context *ctx,
                                     const stof_mask_family *fam, int batch,
                                     int heads, int seq_q, int seq_k,
                                     int block_m, int block_n,
                                     stof_mb_workspace *ws)
{
    if (!(stof__family_spec(fam)->uses & STOF_SPEC_USES_HEAD) || heads <= 1)
        return stof__mb_workspace_new(ctx, fam, batch, seq_q, seq_k, block_m,
                                      block_n, ws);
    memset(ws, 0, sizeof(*ws));
    STOF_CHECK_ARG(ctx, stof__family_n_seq(fam) == 0,
                   "GPU format builder: a window per head (head_*) with the "
                   "packed layout is not supported");
    STOF_CHECK_ARG(ctx, (int64_t)batch * heads <= 65535,
                   "GPU format builder: %d x %d (sequence, head) formats, at "
                   "most 65535 for a family whose windows depend on the head",
                   batch, heads);
    stof_status st = stof__mb_workspace_new(ctx, fam, batch * heads, seq_q,
                                            seq_k, block_m, block_n, ws);
    if (st == STOF_OK)
        ws->heads = heads;
    return st;
}

static stof_status workspace_new(stof_context *ctx,
                                 const stof_mask_family *fam, int batch,
                                 int n_seq, int seq_q, int seq_k, int block_m,
                                 int block_n, stof_mb_workspace *ws)
{
    memset(ws, 0, sizeof(*ws));
    STOF_CHECK_ARG(ctx, batch >= 1 && seq_q >= 1 && seq_k >= 1,
                   "GPU format builder: batch %d of %d x %d", batch, seq_q,
                   seq_k);
    const int prog_only = block_m == 0 && block_n == 0;
    STOF_CHECK_ARG(ctx, prog_only || (block_m >= 1 && block_n >= 1),
                   "GPU format builder: %dx%d tiles", block_m, block_n);
    int32_t prog[4 * STOF_MB_MAX_NODES];
    int depth = 0;
    const int n = stof__spec_program(stof__family_spec(fam), prog,
                                     STOF_MB_MAX_NODES, &depth);
    if (n < 0 || depth > STOF_MB_MAX_STACK)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "the GPU format builder does not evaluate \"%.200s\" "
                          "(random leaves, bigbird with more than %d random "
                          "blocks, and specs of more than %d nodes or %d "
                          "nested operands, are built on the CPU)",
                          stof_mask_family_spec(fam), STOF_PROG_MAX_RANDOM,
                          STOF_MB_MAX_NODES, STOF_MB_MAX_STACK);
    ws->n_prog = n;
    ws->n_seq = n_seq;
    ws->heads = 1;
    ws->row_one = n_seq ? 0 : stof__family_rows_one(fam);
    ws->batch = batch;
    ws->seq_q = seq_q;
    ws->seq_k = seq_k;
    ws->block_m = block_m;
    ws->block_n = block_n;
    /* Packed: the clamped offsets (stof_mb_seqs), after the statistics. */
    const size_t pk_bytes = n_seq ? 2u * ((size_t)n_seq + 1u) * 4u : 0u;
    if (prog_only) {
        const size_t o_stats = align256((size_t)n * 16u);
        const size_t o_pk = o_stats + align256(STOF_MB_STATS * 8);
        stof_status st = mb_alloc(ctx, ws, prog, n, o_stats,
                                  o_pk + align256(pk_bytes));
        if (st == STOF_OK && n_seq)
            ws->pk = ws->mem + o_pk;
        return st;
    }
    ws->n_rb = (seq_q + block_m - 1) / block_m;
    ws->n_cb = (seq_k + block_n - 1) / block_n;
    ws->bwpr = (block_n + 31) / 32;
    const int64_t rbs = (int64_t)batch * ws->n_rb;
    ws->tile_cap = rbs * ws->n_cb;
    if (ws->tile_cap > INT32_MAX)
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "GPU format builder: %lld tiles (%d sequences, "
                          "times heads where the mask differs by head, of "
                          "%d x %d in %dx%d tiles) do not fit 32-bit "
                          "indices: at most 2^31 - 1 a batch (plan fewer "
                          "sequences)",
                          (long long)ws->tile_cap, batch, seq_q, seq_k,
                          block_m, block_n);
    STOF_CHECK_ARG(ctx, block_m * ws->bwpr <= MB_MAX_TILE_WORDS,
                   "GPU format builder: %dx%d tiles are too large", block_m,
                   block_n);
    /* Packed: each sequence's lines over the row and key blocks it meets,
     * which number at most n_rb + n_seq and n_cb + n_seq in all (the
     * bound is linear in them before its cap). */
    ws->pool_cap =
        n_seq ? stof__mb_pool_bound(prog, n, ws->n_rb + n_seq,
                                    ws->n_cb + n_seq, block_m, block_n)
              : (int64_t)batch * stof__mb_pool_bound(prog, n, ws->n_rb,
                                                     ws->n_cb, block_m,
                                                     block_n);
    if (ws->pool_cap > ws->tile_cap)
        ws->pool_cap = ws->tile_cap;
    const size_t nt = (size_t)ws->tile_cap;
    const size_t bm_words = (size_t)block_m * (size_t)ws->bwpr;
    size_t off = align256((size_t)n * 16u); /* the program, at 0 */
    const size_t o_stats = off;
    off += align256(STOF_MB_STATS * 8);
    const size_t o_pk = off;
    off += align256(pk_bytes);
    const size_t o_cnt = off;
    off += align256((size_t)rbs * 8u);
    const size_t o_rp = off;
    off += align256(((size_t)rbs + 1u) * 4u);
    const size_t docs = (stof__family_spec(fam)->uses & STOF_SPEC_USES_DOCS)
                            ? (size_t)batch * (size_t)seq_k * 4u
                            : 0u;
    const size_t o_dlo = off;
    off += align256(docs);
    const size_t o_dhi = off;
    off += align256(docs);
    const size_t o_cls = off;
    off += align256(nt);
    const size_t o_col = off;
    off += align256(nt * 4u);
    const size_t o_kind = off;
    off += align256(nt);
    const size_t o_bidx = off;
    off += align256(nt * 4u);
    const size_t o_slot = off;
    off += align256(nt * 4u);
    const size_t o_bits = off;
    off += align256((size_t)ws->pool_cap * bm_words * 4u);

    stof_status st = mb_alloc(ctx, ws, prog, n, o_stats, off);
    if (st != STOF_OK)
        return st;
    const CUdeviceptr mem = ws->mem;
    ws->pk = n_seq ? mem + o_pk : 0;
    ws->cnt = mem + o_cnt;
    ws->row_ptr = mem + o_rp;
    ws->doc_lo = docs ? mem + o_dlo : 0;
    ws->doc_hi = docs ? mem + o_dhi : 0;
    ws->cls = mem + o_cls;
    ws->col_idx = mem + o_col;
    ws->kind = mem + o_kind;
    ws->bitmap_idx = mem + o_bidx;
    ws->bitmaps = mem + o_bits;
    ws->tslot = mem + o_slot;
    return STOF_OK;
}

void stof__mb_workspace_free(stof_context *ctx, stof_mb_workspace *ws)
{
    if (ws->mem && stof__ctx_push(ctx) == STOF_OK) {
        ctx->api->cuMemFree(ws->mem);
        stof__ctx_pop(ctx);
    }
    memset(ws, 0, sizeof(*ws));
}

static void mb_params(const stof_mb_workspace *ws, const stof_mb_data *data,
                      stof_mb_params *out)
{
    stof_mb_params p;
    memset(&p, 0, sizeof(p));
    p.prog = ws->prog;
    p.n_prog = ws->n_prog;
    p.batch = ws->batch;
    p.seq_q = ws->seq_q;
    p.seq_k = ws->seq_k;
    p.block_m = ws->block_m;
    p.block_n = ws->block_n;
    p.n_rb = ws->n_rb;
    p.n_cb = ws->n_cb;
    p.bwpr = ws->bwpr;
    if (data) {
        p.q_len = data->q_len;
        p.k_len = data->k_len;
        p.q_offset = data->q_offset;
        p.prefix = data->prefix;
        p.doc_id = data->doc_id;
        p.doc_stride = data->doc_stride ? data->doc_stride : ws->seq_k;
        p.seed = data->seed;
        p.bitmap = data->bitmap;
        p.bitmap_stride = data->bitmap_stride;
        p.bitmap_words = data->bitmap_words ? data->bitmap_words
                                            : (ws->seq_k + 31) / 32;
        p.head_window = data->head_window;
    }
    p.heads_data = ws->heads;
    p.row_one = ws->row_one;
    if (ws->n_seq) {
        /* Packed: this run's rows and keys (at most the workspace's), and
         * the tile grid they cover; lengths come from the offsets. */
        p.n_seq = ws->n_seq;
        p.pk = ws->pk;
        p.q_len = p.k_len = 0;
        if (data) {
            p.cu_q = data->cu_q;
            p.cu_k = data->cu_k;
            if (data->total_q > 0 && data->total_q < ws->seq_q)
                p.seq_q = data->total_q;
            if (data->total_k > 0 && data->total_k < ws->seq_k)
                p.seq_k = data->total_k;
        }
        if (ws->block_m > 0) {
            p.n_rb = (p.seq_q + ws->block_m - 1) / ws->block_m;
            p.n_cb = (p.seq_k + ws->block_n - 1) / ws->block_n;
        }
    }
    if (p.doc_id && ws->doc_lo) {
        p.doc_lo = ws->doc_lo;
        p.doc_hi = ws->doc_hi;
    }
    p.cls = ws->cls;
    p.cnt = ws->cnt;
    p.row_ptr = ws->row_ptr;
    p.col_idx = ws->col_idx;
    p.kind = ws->kind;
    p.bitmap_idx = ws->bitmap_idx;
    p.bitmaps = ws->bitmaps;
    p.tile_cap = ws->tile_cap;
    p.stats = ws->stats;
    p.tslot = ws->tslot;
    p.pool_cap = ws->pool_cap;
    *out = p;
}

static CUresult mb_launch1(CUfunction fn, unsigned gx, unsigned gy,
                           unsigned threads, CUstream s, void **args,
                           const stof_api *api)
{
    return api->cuLaunchKernel(fn, gx, gy, 1, threads, 1, 1, 0, s, args,
                               NULL);
}

stof_status stof__mb_launch_with(CUfunction fn, const void *first,
                                 const stof_mb_workspace *ws,
                                 const stof_mb_data *data, unsigned gx,
                                 unsigned gy, unsigned threads, CUstream s,
                                 const stof_api *api)
{
    stof_mb_params p;
    mb_params(ws, data, &p);
    void *args[] = {(void *)first, &p};
    return api->cuLaunchKernel(fn, gx, gy, 1, threads, 1, 1, 0, s, args,
                               NULL) == CUDA_SUCCESS
               ? STOF_OK
               : STOF_ERR_CUDA;
}

stof_status stof__mb_prepare(const stof_mb_kernels *k,
                             const stof_mb_workspace *ws,
                             const stof_mb_data *data, CUstream s,
                             const stof_api *api)
{
    if (!ws->n_seq)
        return STOF_OK;
    stof_mb_params p;
    mb_params(ws, data, &p);
    if (!p.cu_q)
        return STOF_ERR_INVALID_ARGUMENT; /* packed needs the offsets */
    void *args[] = {&p};
    return mb_launch1(k->seqs, 1, 1, MB_SEQS_THREADS, s, args, api) ==
                   CUDA_SUCCESS
               ? STOF_OK
               : STOF_ERR_CUDA;
}

stof_status stof__mb_build(const stof_mb_kernels *k,
                           const stof_mb_workspace *ws,
                           const stof_mb_data *data, CUstream s,
                           const stof_api *api)
{
    stof_status st = stof__mb_prepare(k, ws, data, s, api);
    if (st != STOF_OK)
        return st;
    stof_mb_params p;
    mb_params(ws, data, &p);
    void *args[] = {&p};
    CUresult r = CUDA_SUCCESS;
    if (p.doc_lo) {
        /* The document intervals next; the other kernels read them. */
        r = mb_launch1(k->docs,
                       (unsigned)((p.seq_k + MB_THREADS - 1) / MB_THREADS),
                       (unsigned)ws->batch, MB_THREADS, s, args, api);
    }
    if (r == CUDA_SUCCESS)
        r = mb_launch1(k->classify, (unsigned)p.n_rb, (unsigned)ws->batch,
                       MB_THREADS, s, args, api);
    if (r == CUDA_SUCCESS)
        r = mb_launch1(k->scan, 1, 1, MB_SCAN_THREADS, s, args, api);
    if (r == CUDA_SUCCESS)
        r = mb_launch1(k->fill, (unsigned)p.n_rb, (unsigned)ws->batch,
                       MB_THREADS, s, args, api);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}

/* Mirrors struct stof_mb_rw in mask_build.cu. */
typedef struct stof_mb_rw {
    int group, n_words;
    CUdeviceptr orw, nk, key_ptr, keys, row_off, row_bits, tile_ptr, kind,
        bitmap_idx, bitmaps, n_partial;
} stof_mb_rw;
_Static_assert(sizeof(stof_mb_rw) == 8 + 11 * 8,
               "stof_mb_rw must match mask_build.cu");

stof_status stof__mb_rowwise_build(stof_context *ctx, const stof_mb_kernels *k,
                                   const stof_mask_family *fam, int seq_q,
                                   int seq_k, int block_m, int block_n,
                                   int group, stof_rowwise_format *rf,
                                   int32_t **nk_out)
{
    memset(rf, 0, sizeof(*rf));
    if (nk_out)
        *nk_out = NULL;
    STOF_CHECK_ARG(ctx, block_n % 32 == 0 && block_m >= 1 &&
                            block_m <= 256 && group >= 1 && group <= 16,
                   "GPU row-wise format: %dx%d tiles, rows grouped by %d",
                   block_m, block_n, group);
    stof_mb_workspace pw;
    stof_status st = stof__mb_workspace_new(ctx, fam, 1, seq_q, seq_k, 0, 0,
                                            &pw);
    if (st != STOF_OK)
        return st;
    stof_mb_params p;
    mb_params(&pw, NULL, &p);
    p.block_m = block_m;
    p.block_n = block_n;
    p.bwpr = block_n / 32;
    p.n_rb = (seq_q + block_m - 1) / block_m;
    const int n_rb = p.n_rb, n_words = (seq_k + 31) / 32, bwpr = p.bwpr;
    stof_mb_rw R;
    memset(&R, 0, sizeof(R));
    R.group = group;
    R.n_words = n_words;
    int32_t *nk = malloc(sizeof(int32_t) * (size_t)n_rb);
    int32_t *kp = malloc(sizeof(int32_t) * ((size_t)n_rb + 1));
    int32_t *tp = malloc(sizeof(int32_t) * ((size_t)n_rb + 1));
    int64_t *ro = malloc(sizeof(int64_t) * ((size_t)n_rb + 1));
    CUdeviceptr scratch = 0, mem = 0;
    if (!nk || !kp || !tp || !ro) {
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    if ((st = (stof_status)stof__ctx_push(ctx)) != STOF_OK)
        goto out;
    const stof_api *api = ctx->api;
    /* Pass 1: the OR of each block's rows, and its listed keys. */
    const size_t o_orw = 0,
                 o_nk = align256((size_t)n_rb * (size_t)n_words * 4u);
    STOF_CU_GOTO(ctx, st, pop,
                 api->cuMemAlloc(&scratch, o_nk + align256((size_t)n_rb * 4u)));
    R.orw = scratch + o_orw;
    R.nk = scratch + o_nk;
    void *args[] = {&p, &R};
    STOF_CU_GOTO(ctx, st, pop,
                 api->cuMemsetD8(R.nk, 0, sizeof(int32_t) * (size_t)n_rb));
    STOF_CU_GOTO(ctx, st, pop,
                 api->cuLaunchKernel(k->rw_or, (unsigned)n_rb,
                                     (unsigned)((n_words + 31) / 32), 1,
                                     MB_THREADS, 1, 1, 0, NULL, args, NULL));
    STOF_CU_GOTO(ctx, st, pop,
                 api->cuMemcpyDtoH(nk, R.nk, sizeof(int32_t) * (size_t)n_rb));
    /* The lists' and tiles' offsets. */
    int64_t keys = 0, tiles = 0, words = 0, most_words = 0;
    int most = 0;
    for (int i = 0; i < n_rb; i++) {
        const int rows = seq_q - i * block_m < block_m ? seq_q - i * block_m
                                                       : block_m;
        const int64_t nt = ((int64_t)nk[i] + block_n - 1) / block_n;
        const int64_t rw = (int64_t)rows * ((nk[i] + 31) / 32);
        kp[i] = (int32_t)keys;
        tp[i] = (int32_t)tiles;
        ro[i] = words;
        keys += nk[i];
        tiles += nt;
        words += rw;
        most = nt > most ? (int)nt : most;
        most_words = rw > most_words ? rw : most_words;
    }
    kp[n_rb] = (int32_t)keys;
    tp[n_rb] = (int32_t)tiles;
    ro[n_rb] = words;
    /* The format (as stof__rowwise_format_upload lays it out, with room
     * for a bitmap per tile: the partial ones are known after pass 2),
     * then pass 2's scratch. */
    stof_rowwise_layout lay;
    const size_t total =
        stof__rowwise_layout(n_rb, keys, tiles, tiles, block_m, bwpr, &lay);
    if (keys > INT32_MAX || tiles > INT32_MAX || !total) {
        st = stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                        "GPU row-wise format: %lld keys in %lld tiles do "
                        "not fit 32-bit indices",
                        (long long)keys, (long long)tiles);
        goto pop;
    }
    const size_t nrp = (size_t)n_rb + 1u;
    STOF_CU_GOTO(ctx, st, pop, api->cuMemAlloc(&mem, total));
    STOF_CU_GOTO(ctx, st, pop, api->cuMemsetD8(mem, 0, total));
    STOF_CU_GOTO(ctx, st, pop,
                 api->cuMemcpyHtoD(mem + lay.key_ptr, kp, nrp * 4u));
    STOF_CU_GOTO(ctx, st, pop,
                 api->cuMemcpyHtoD(mem + lay.tile_ptr, tp, nrp * 4u));
    CUdeviceptr s2 = 0;
    const size_t o_ro = 0, o_cnt = align256(nrp * 8u),
                 o_rb = o_cnt + 256u;
    STOF_CU_GOTO(ctx, st, pop,
                 api->cuMemAlloc(&s2, o_rb + align256((size_t)words * 4u)));
    R.row_off = s2 + o_ro;
    R.n_partial = s2 + o_cnt;
    R.row_bits = s2 + o_rb;
    stof__rowwise_format_at(rf, mem, &lay);
    R.key_ptr = rf->key_ptr;
    R.keys = rf->keys;
    R.tile_ptr = rf->tile_ptr;
    R.kind = rf->kind;
    R.bitmap_idx = rf->bitmap_idx;
    R.bitmaps = rf->bitmaps;
    unsigned long long n_partial = 0;
    CUresult r = api->cuMemcpyHtoD(R.row_off, ro, nrp * 8u);
    if (r == CUDA_SUCCESS)
        r = api->cuMemsetD8(R.n_partial, 0, 8);
    /* The key lists, each row's bits over them (a word a thread), then
     * the tiles. */
    if (r == CUDA_SUCCESS)
        r = api->cuLaunchKernel(k->rw_keys, (unsigned)n_rb, 1, 1, MB_THREADS,
                                1, 1, 0, NULL, args, NULL);
    if (r == CUDA_SUCCESS && most_words > 0)
        r = api->cuLaunchKernel(
            k->rw_bits, (unsigned)n_rb,
            (unsigned)((most_words + MB_THREADS - 1) / MB_THREADS), 1,
            MB_THREADS, 1, 1, 0, NULL, args, NULL);
    if (r == CUDA_SUCCESS)
        r = api->cuLaunchKernel(k->rw_tiles, (unsigned)n_rb, 1, 1,
                                MB_THREADS, 1, 1, 0, NULL, args, NULL);
    if (r == CUDA_SUCCESS)
        r = api->cuMemcpyDtoH(&n_partial, R.n_partial, 8);
    api->cuMemFree(s2);
    if (r != CUDA_SUCCESS) {
        st = (stof_status)stof__cuda_fail(ctx, r, "GPU row-wise format",
                                          __FILE__, __LINE__);
        goto pop;
    }
    rf->seq_q = seq_q;
    rf->seq_k = seq_k;
    rf->block_m = block_m;
    rf->block_n = block_n;
    rf->n_row_blocks = n_rb;
    rf->bitmap_words_per_row = bwpr;
    rf->max_tiles = most;
    rf->n_keys = keys;
    rf->n_tiles = tiles;
    rf->n_partial = (int64_t)n_partial;
    mem = 0;
pop:
    if (mem) { /* failed after the format's allocation: nothing kept */
        api->cuMemFree(mem);
        memset(rf, 0, sizeof(*rf));
    }
    if (scratch)
        api->cuMemFree(scratch);
    stof__ctx_pop(ctx);
out:
    if (st == STOF_OK && nk_out) {
        *nk_out = nk;
        nk = NULL;
    }
    free(nk);
    free(kp);
    free(tp);
    free(ro);
    stof__mb_workspace_free(ctx, &pw);
    return st;
}
