/*
 * cost_model.c - see cost_model.h for the model. The constants are
 * calibrated from stof-bench-kernels runs (COST_MODEL.md has the data).
 */
#include "cost_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* 1 once the row-wise (gather) kernel exists. */
#ifndef STOF__ROWWISE_AVAILABLE
#define STOF__ROWWISE_AVAILABLE 0
#endif

/* Tensor-core rate of one SM for mma.sync m16n8k16 with fp32 accumulation,
 * in FLOP per microsecond: H100/H200 (sm_90) reach about 5.0 TFLOP/s per SM
 * this way (660 over 132 SMs; wgmma is needed beyond), A100 (sm_80) 2.9. */
static double sm_rate_flop_per_us(const stof_device *dev)
{
    if (dev->cc_major >= 9)
        return 5.0e6;
    if (dev->cc_major == 8 && dev->cc_minor == 0)
        return 2.9e6;
    return 1.6e6; /* sm_86/89 consumer parts: a conservative guess */
}

/* e(cfg, D): the fraction of sm_rate a configuration reaches on dense work
 * at its natural occupancy. Larger tiles amortise the softmax and the
 * loads; 4 warps owning 32 rows each reuse every K/V fragment twice. */
static double cfg_efficiency(int head_dim, const stof_block_cfg *c)
{
    const int rows_per_warp = c->block_m / c->warps;
    double e = 0.62;
    if (head_dim <= 32)
        e = 0.40;
    else if (head_dim == 64)
        e = 0.56;
    else if (head_dim >= 256)
        e = 0.60;
    if (rows_per_warp >= 32)
        e *= 1.10;
    if (c->block_n == 32)
        e *= 0.93;
    else if (c->block_n == 128)
        e *= 1.02;
    if (c->stages == 1)
        e *= 0.92;
    return e;
}

/* CTAs of this configuration that fit on one SM. Registers are estimated
 * from the accumulators (the compiler's count is known only after the
 * compile; the estimate keeps the ranking cheap). */
static int ctas_per_sm(const stof_device *dev, int head_dim,
                       const stof_block_cfg *c)
{
    const int threads = 32 * c->warps;
    const int mt = c->block_m / c->warps / 16;
    int regs = mt * (c->block_n / 2 + head_dim / 2) + 72;
    if (mt * head_dim <= 128)
        regs += mt * head_dim / 4;
    regs = regs > 255 ? 255 : (regs + 7) / 8 * 8;
    int by_regs = 65536 / (threads * regs);
    int smem_sm = dev->cc_major >= 9 ? 228 * 1024 : 164 * 1024;
    size_t smem = stof__block_smem_bytes(head_dim, c) + 1024;
    int by_smem = (int)((size_t)smem_sm / smem);
    int by_threads = 2048 / threads;
    int o = by_regs < by_smem ? by_regs : by_smem;
    o = o < by_threads ? o : by_threads;
    return o < 1 ? 1 : o;
}

/* Extra cost of a masked tile relative to a full one (bitmap load and
 * apply), and of gathering K/V rows by index. */
#define MU_PARTIAL 0.18
#define GAMMA_GATHER 1.08
/* Per-CTA fixed cost in tile units: loading Q, the epilogue, the start. */
#define TAU0_TILES 1.5
#define LAUNCH_US 4.0

typedef struct slot_heap {
    double *t;
    int n;
} slot_heap;

static void heap_down(slot_heap *h, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && h->t[l] < h->t[m])
            m = l;
        if (r < h->n && h->t[r] < h->t[m])
            m = r;
        if (m == i)
            return;
        double x = h->t[i];
        h->t[i] = h->t[m];
        h->t[m] = x;
        i = m;
    }
}

double stof__cost_predict(const stof_device *dev, const stof_attention_desc *d,
                          const stof_format *f, int kind,
                          const stof_block_cfg *cfg, stof_candidate *out)
{
    const int D = d->head_dim;
    const double rate = sm_rate_flop_per_us(dev) * cfg_efficiency(D, cfg);
    const double tau = 4.0 * cfg->block_m * cfg->block_n * D / rate; /* us */
    const int o = ctas_per_sm(dev, D, cfg);
    const int nrb = f->n_row_blocks;
    double *w = malloc(sizeof(double) * (size_t)(nrb > 0 ? nrb : 1));
    if (!w)
        return INFINITY;
    double total = 0.0;
    for (int i = 0; i < nrb; i++) {
        double wi;
        if (kind == STOF_KERNEL_ROWWISE) {
            int64_t keys = f->rw_ptr[i + 1] - f->rw_ptr[i];
            double tiles = (double)((keys + cfg->block_n - 1) / cfg->block_n);
            double fill = f->rowwise_fill;
            wi = GAMMA_GATHER * tiles * (1.0 + MU_PARTIAL * (1.0 - fill));
        } else {
            int64_t full = 0, part = 0;
            for (int64_t e = f->row_ptr[i]; e < f->row_ptr[i + 1]; e++) {
                if (f->kind[e] == STOF_TILE_FULL)
                    full++;
                else
                    part++;
            }
            wi = (double)full + (1.0 + MU_PARTIAL) * (double)part;
        }
        w[i] = wi;
        total += wi;
    }
    /* Greedy list scheduling in launch order (blockIdx.x = row block
     * fastest, then batch*head) over SMs * o slots. */
    const int slots = dev->sm_count * o > 0 ? dev->sm_count * o : 1;
    slot_heap h = {calloc((size_t)slots, sizeof(double)), slots};
    double makespan = 0.0;
    if (!h.t) {
        free(w);
        return INFINITY;
    }
    const int64_t bh = (int64_t)d->batch * d->heads;
    for (int64_t b = 0; b < bh; b++) {
        for (int i = 0; i < nrb; i++) {
            double t = h.t[0] + o * (w[i] + TAU0_TILES) * tau;
            h.t[0] = t;
            if (t > makespan)
                makespan = t;
            heap_down(&h, 0);
        }
    }
    free(h.t);
    free(w);
    double ms = (makespan + LAUNCH_US) * 1e-3;
    if (out) {
        memset(out, 0, sizeof(*out));
        out->kind = kind;
        out->cfg = *cfg;
        out->predicted_ms = ms;
        out->work_tiles = total;
        out->ctas_per_sm = o;
    }
    return ms;
}

static int cmp_cand(const void *a, const void *b)
{
    const stof_candidate *x = a, *y = b;
    return (x->predicted_ms > y->predicted_ms) - (x->predicted_ms < y->predicted_ms);
}

stof_status stof__cost_rank(stof_context *ctx, const stof_attention_desc *d,
                            const stof_mask *m, stof_candidate *cands,
                            int max, int *n)
{
    static const int bms[] = {64, 128}, bns[] = {32, 64, 128}, ws[] = {4, 8},
                     ss[] = {1, 2, 3};
    *n = 0;
    stof_candidate *all = NULL;
    int count = 0, cap = 0;
    stof_status st = STOF_OK;
    for (int a = 0; a < 2; a++) {
        for (int b = 0; b < 3; b++) {
            stof_format *f = NULL;
            int have_valid = 0;
            for (int x = 0; x < 2 && !have_valid; x++)
                for (int y = 0; y < 3 && !have_valid; y++) {
                    stof_block_cfg c = {.block_m = bms[a], .block_n = bns[b], .warps = ws[x], .stages = ss[y]};
                    have_valid = stof__block_cfg_valid(&ctx->device,
                                                       d->head_dim, &c, NULL, 0);
                }
            if (!have_valid)
                continue;
            st = stof_format_build(ctx, m, bms[a], bns[b], &f);
            if (st != STOF_OK)
                goto done;
            for (int x = 0; x < 2; x++)
                for (int y = 0; y < 3; y++) {
                    stof_block_cfg c = {.block_m = bms[a], .block_n = bns[b], .warps = ws[x], .stages = ss[y]};
                    if (!stof__block_cfg_valid(&ctx->device, d->head_dim, &c,
                                               NULL, 0))
                        continue;
                    for (int kind = STOF_KERNEL_BLOCK;
                         kind <= STOF_KERNEL_BLOCK + STOF__ROWWISE_AVAILABLE;
                         kind++) {
                        if (count == cap) {
                            cap = cap ? 2 * cap : 64;
                            stof_candidate *p = realloc(all, sizeof(*all) * cap);
                            if (!p) {
                                stof_format_free(&f);
                                st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                                                "out of memory ranking kernels");
                                goto done;
                            }
                            all = p;
                        }
                        stof__cost_predict(&ctx->device, d, f, kind, &c,
                                           &all[count++]);
                    }
                }
            stof_format_free(&f);
        }
    }
    if (count == 0) {
        st = STOF_ERR_UNSUPPORTED;
        goto done;
    }
    qsort(all, (size_t)count, sizeof(*all), cmp_cand);
    *n = count < max ? count : max;
    memcpy(cands, all, sizeof(*all) * (size_t)*n);
done:
    free(all);
    return st;
}
