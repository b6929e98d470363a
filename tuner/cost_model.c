/*
 * cost_model.c - see cost_model.h for the model. The constants are
 * calibrated from stof-bench-kernels / stof-bench-wgmma runs and the
 * search's own timings (bench/RESULTS.md has the measurements).
 */
#include "cost_model.h"
#include "attn_block.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


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
    /* Calibrated on an H200 (stof-bench-kernels, 2026-11-21): 128x64 w4 s2
     * reaches 283 TFLOP/s at head_dim 64 and 128x32 w4 s2 306 at 128, i.e.
     * 0.43 and 0.46 of 660. */
    double e = 0.45;
    if (head_dim <= 32)
        e = 0.30;
    else if (head_dim == 64)
        e = 0.39;
    else if (head_dim >= 256)
        e = 0.42;
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
#define GAMMA_GATHER 1.03
/* Per-CTA fixed cost in tile units: loading Q, the epilogue, the start. */
#define TAU0_TILES 1.5
/* The persistent kernel's fixed cost per work item after its first: the
 * next item's Q and first tiles load under the current one's last tiles
 * and epilogue; what remains is the pipeline's refill at the boundary. */
#define TAU0_PERSIST_TILES 0.5
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

/* Tile work of each row block (w_i of the model). */
static double *row_work(const stof_format *f, int kind, int block_n,
                        double mu, double *total)
{
    const int nrb = f->n_row_blocks;
    /* Row-wise: the share of compacted tiles that need their bitmap. */
    double pfrac = 1.0;
    if (kind == STOF_KERNEL_ROWWISE) {
        int64_t tiles = 0, partial = 0;
        if (stof__rowwise_stats(f, NULL, &tiles, &partial, NULL) == STOF_OK &&
            tiles > 0)
            pfrac = (double)partial / (double)tiles;
    }
    double *w = malloc(sizeof(double) * (size_t)(nrb > 0 ? nrb : 1));
    if (!w)
        return NULL;
    *total = 0.0;
    for (int i = 0; i < nrb; i++) {
        double wi;
        if (kind == STOF_KERNEL_ROWWISE) {
            int64_t keys = f->rw_ptr[i + 1] - f->rw_ptr[i];
            double tiles = (double)((keys + block_n - 1) / block_n);
            wi = GAMMA_GATHER * tiles * (1.0 + mu * pfrac);
        } else {
            int64_t full = 0, part = 0;
            for (int64_t e = f->row_ptr[i]; e < f->row_ptr[i + 1]; e++) {
                if (f->kind[e] == STOF_TILE_FULL)
                    full++;
                else
                    part++;
            }
            wi = (double)full + (1.0 + mu) * (double)part;
        }
        w[i] = wi;
        *total += wi;
    }
    return w;
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* Makespan in us of batch*heads copies of the row blocks' CTAs (work w[i]
 * tiles of tau us each, plus TAU0_TILES) on `slots` slots of which o share
 * an SM, in launch order (row block fastest), greedy list scheduling. With
 * heavy_first the row blocks are launched heaviest first. */
static double makespan_us(double *w, int nrb, int64_t bh, int slots, int o,
                          double tau, int heavy_first)
{
    if (heavy_first)
        qsort(w, (size_t)nrb, sizeof(double), cmp_desc);
    slot_heap h = {calloc((size_t)slots, sizeof(double)), slots};
    if (!h.t)
        return INFINITY;
    /* Greedy list scheduling leaves no slot idle once every slot has
     * work, so after enough copies each further copy adds its work over
     * the slots to the slots' time on average. Many copies (a large batch
     * x heads) are simulated for about 16 waves and the rest added at that
     * rate in whole periods of p copies (p x nrb CTAs a whole number of
     * waves), so the simulated part keeps the last wave's rounding. */
    double copy_work = 0.0;
    for (int i = 0; i < nrb; i++)
        copy_work += o * (w[i] + TAU0_TILES) * tau;
    int64_t sim = bh, periods = 0, p = 1;
    if (nrb > 0) {
        int64_t a = slots, b = nrb;
        while (b) {
            const int64_t t = a % b;
            a = b;
            b = t;
        }
        p = slots / a; /* copies a whole number of waves */
        int64_t base = (16 * (int64_t)slots + nrb - 1) / nrb;
        if (base < 8)
            base = 8;
        if (bh >= base + 2 * p) {
            periods = (bh - base) / p;
            sim = bh - periods * p;
        }
    }
    double makespan = 0.0;
    for (int64_t b = 0; b < sim; b++) {
        for (int i = 0; i < nrb; i++) {
            double t = h.t[0] + o * (w[i] + TAU0_TILES) * tau;
            h.t[0] = t;
            if (t > makespan)
                makespan = t;
            heap_down(&h, 0);
        }
    }
    free(h.t);
    return makespan + (double)periods * (double)p * copy_work / slots;
}

/* makespan_us for the persistent kernel, as its static schedule
 * (attn_wgmma.cu, wg_sched; hg as stof__wgmma_persist_deal_max, the row
 * blocks heaviest first with heavy_first); each CTA pays TAU0_TILES once
 * and TAU0_PERSIST_TILES per item. */
static double makespan_persist_us(double *w, int nrb, int64_t bh, int hg,
                                  int slots, int o, double tau,
                                  int heavy_first)
{
    if (heavy_first)
        qsort(w, (size_t)nrb, sizeof(double), cmp_desc);
    double *t = calloc((size_t)slots, sizeof(double));
    if (!t)
        return INFINITY;
    const double m = stof__wgmma_persist_deal_max(w, nrb, bh, hg, slots,
                                                  TAU0_PERSIST_TILES, t);
    free(t);
    return o * m * tau + o * (TAU0_TILES - TAU0_PERSIST_TILES) * tau;
}

/* DRAM bandwidth of the device in bytes per microsecond, a little under
 * the peak (H100 SXM 3.35 TB/s, H200 4.8: 3.0e6 is safe for both; A100
 * 1.5-2.0 TB/s). */
static double dram_bytes_per_us(const stof_device *dev)
{
    if (dev->cc_major >= 9)
        return 3.0e6;
    if (dev->cc_major == 8 && dev->cc_minor == 0)
        return 1.5e6;
    return 0.8e6;
}

/* A tile's time when its K and V come from device memory rather than the
 * L2: each key block of f is read by `reuse` CTAs that run at about the
 * same time (the row blocks listing it, times the query heads sharing a
 * K/V head), so a tile moves 2 * block_n * head_dim 16-bit values / reuse
 * from DRAM, at the SM's share of the bandwidth. Decode-like problems (one
 * row block, no K/V sharing) are bound by this, not by the tensor cores. */
static double tile_mem_us(const stof_device *dev, const stof_attention_desc *d,
                          const stof_format *f, int block_n)
{
    int64_t tiles = f->n_row_blocks > 0 ? f->row_ptr[f->n_row_blocks] : 0;
    int64_t used = 0;
    if (f->col_idx && tiles > 0 && f->n_col_blocks > 0) {
        unsigned char *seen = calloc((size_t)f->n_col_blocks, 1);
        if (seen) {
            for (int64_t e = 0; e < tiles; e++) {
                const int c = f->col_idx[e];
                if (c >= 0 && c < f->n_col_blocks && !seen[c]) {
                    seen[c] = 1;
                    used++;
                }
            }
            free(seen);
        }
    }
    const double reuse = (used > 0 ? (double)tiles / (double)used : 1.0) *
                         (double)stof__kv_group(d);
    const double bytes = 4.0 * block_n * d->head_dim / (reuse > 1.0 ? reuse : 1.0);
    const int sms = dev->sm_count > 0 ? dev->sm_count : 1;
    return bytes / (dram_bytes_per_us(dev) / sms);
}

/* The model's time in ms of a kernel with the given per-tile time (tau,
 * us) and CTAs per SM (o) on format f (row work by `wkind`, mask cost mu),
 * its row blocks' tiles split over `splits` CTAs each (0/1: not split;
 * then a merge pass reads the partials); heavy_first as makespan_us;
 * persist: the persistent schedule (makespan_persist_us, never split).
 * *total: the row work of one (batch, head) in tiles. */
static double predict_ms(const stof_device *dev, const stof_attention_desc *d,
                         const stof_format *f, int wkind, int block_n,
                         double tau, int o, double mu, int heavy_first,
                         int persist, int splits, int fold, double *total)
{
    double *w = row_work(f, wkind, block_n, mu, total);
    if (!w)
        return INFINITY;
    int nrb = f->n_row_blocks;
    if (fold > 1) {
        /* CTAs of `fold` row blocks that list the same tiles
         * (stof__wgmma_uniform_triples): the first's tiles, each of tau. */
        nrb = (nrb + fold - 1) / fold;
        *total = 0.0;
        for (int i = 0; i < nrb; i++) {
            w[i] = w[fold * i];
            *total += w[i];
        }
    }
    const int s = splits > 1 ? splits : 1;
    double *ws = w;
    if (s > 1) {
        ws = malloc(sizeof(double) * (size_t)(nrb > 0 ? nrb : 1) * (size_t)s);
        if (!ws) {
            free(w);
            return INFINITY;
        }
        for (int i = 0; i < nrb; i++)
            for (int z = 0; z < s; z++)
                ws[(size_t)i * s + z] = w[i] / s;
    }
    const int slots = dev->sm_count * o > 0 ? dev->sm_count * o : 1;
    const int64_t bh = (int64_t)d->batch * d->heads;
    double us = (persist && s == 1
                     ? makespan_persist_us(
                           ws, nrb, bh,
                           stof__wgmma_persist_heads(dev, d, ws, nrb, slots),
                           slots, o, tau, heavy_first)
                     : makespan_us(ws, nrb * s, bh, slots, o, tau,
                                   heavy_first)) +
                LAUNCH_US;
    if (s > 1) {
        /* The partials: written by the kernel, read by the merge (fp32
         * rows of head_dim + 1), and the merge's own launch. */
        const double bytes = 2.0 * 4.0 * s * (double)d->batch * d->heads *
                             d->seq_q * (d->head_dim + 1);
        us += LAUNCH_US + bytes / dram_bytes_per_us(dev);
        free(ws);
    }
    free(w);
    return us * 1e-3;
}

/* stof__cost_predict with the row blocks split over `splits` CTAs. */
static double predict_block(const stof_device *dev,
                            const stof_attention_desc *d, const stof_format *f,
                            int kind, const stof_block_cfg *cfg, int splits,
                            stof_candidate *out)
{
    const int D = d->head_dim;
    const double rate = sm_rate_flop_per_us(dev) * cfg_efficiency(D, cfg);
    double tau = 4.0 * cfg->block_m * cfg->block_n * D / rate; /* us */
    const double tm = tile_mem_us(dev, d, f, cfg->block_n);
    if (tm > tau)
        tau = tm;
    const int o = ctas_per_sm(dev, D, cfg);
    double total = 0.0;
    splits = splits > 1 ? splits : 0;
    const double ms = predict_ms(dev, d, f, kind, cfg->block_n, tau, o,
                                 MU_PARTIAL, 0, 0, splits, 1, &total);
    if (out) {
        memset(out, 0, sizeof(*out));
        out->kind = kind;
        out->cfg = *cfg;
        out->cfg.split = splits > 1;
        out->predicted_ms = ms;
        out->work_tiles = total;
        out->ctas_per_sm = o;
        out->splits = splits;
    }
    return ms;
}

double stof__cost_predict(const stof_device *dev, const stof_attention_desc *d,
                          const stof_format *f, int kind,
                          const stof_block_cfg *cfg, stof_candidate *out)
{
    return predict_block(dev, d, f, kind, cfg, 0, out);
}

/* wgmma: about 990 TFLOP/s dense fp16 on an H100/H200 (7.5 TFLOP/s per
 * SM); the fraction reached on dense work, measured on an H200 with
 * stof-bench-wgmma: 688 TFLOP/s at head_dim 128, 446 at 64 (block_n 128;
 * block_n 64 a little lower). Masked tiles cost relatively more than with
 * mma.sync, since the GEMMs are faster while the mask work is the same. */
#define WGMMA_SM_RATE 7.5e6
#define MU_PARTIAL_WGMMA 0.35

/* 64-row CTAs have one consumer warpgroup: its softmax hides under other
 * CTAs' GEMMs only, so their rate follows the CTAs resident on an SM (o:
 * registers and shared memory, stof__wgmma_ctas_per_sm), relative to
 * 128-row TMA at 128-key tiles; fitted to the search's timings of every
 * wgmma configuration on seven problems (dense, bigbird, sliding,
 * longformer; 512 to 4096 tokens, head_dim 64 and 128; H100, 2026-11-25:
 * bench/RESULTS.md). One CTA an SM runs about two thirds as fast as two;
 * at head_dim 64 three (64-key tiles, up to 3 stages) gain another tenth,
 * and four (no overlap, 2 stages: its 0.89 applies too) 3-9% more than
 * three on sparse masks at 512 and 2048 tokens (H100, 2026-11-25).
 * The persistent grid's 64-row CTAs trailed the ordinary grid's (fitted
 * when the kernel dealt its items itself, unbalanced or L2-unfriendly);
 * with the host's list schedule (stof__wgmma_persist_list) they match it
 * at 2048 tokens and win at 4096 on sparse masks (H100, 2026-11-25), which
 * the factor below does not know yet (stage 1 ranks persistence as a
 * shape of its own: the search timed it on every problem measured). */
static const double M64_RATE[2][4] = {
    {0.72, 1.08, 1.20, 1.36}, /* head_dim 64 */
    {0.67, 0.91, 0.91, 0.91}}; /* 128, 256 */

static double wgmma_efficiency(int head_dim, const stof_wgmma_cfg *c, int o)
{
    const int big = head_dim >= 128;
    const int bm = stof__wgmma_block_m(c);
    double e = big ? 0.70 : 0.46;
    if (c->block_n == 64) /* (64-row: fitted with M64_RATE) */
        e *= bm == 64 ? 0.86 : 0.90;
    if (!c->overlap)
        e *= 0.89;
    /* 192 rows (head_dim 64 only): a third consumer warpgroup's GEMMs
     * under the others' softmax (FlashAttention-3's tile): dense, 5-8%
     * faster than 128 rows at 2048-4096 tokens (H100). */
    if (bm == 192)
        e *= 1.08;
    if (bm == 64) {
        e *= M64_RATE[big][(o < 1 ? 1 : o > 4 ? 4 : o) - 1];
        if (c->persist)
            e *= big ? 0.84 : 0.90;
    }
    /* Gathered K/V (cp.async instead of TMA), dense, relative to the
     * same rows with TMA (H200, stof-bench-wgmma). */
    if (c->gather)
        e *= bm == 64 ? (big ? 0.76 : 0.95) : (big ? 0.81 : 0.90);
    return e;
}

static double predict_wgmma(const stof_device *dev,
                            const stof_attention_desc *d, const stof_format *f,
                            const stof_wgmma_cfg *wc, int splits,
                            stof_candidate *out)
{
    const int D = d->head_dim;
    const int bm = stof__wgmma_block_m(wc);
    /* The CTAs that fit an SM (a persistent grid holds exactly these; its
     * second Q buffer can keep 64-row CTAs to fewer). */
    const int o = stof__wgmma_ctas_per_sm(D, wc);
    const double rate = WGMMA_SM_RATE * wgmma_efficiency(D, wc, o);
    double tau = 4.0 * bm * wc->block_n * D / rate;
    const double tm = tile_mem_us(dev, d, f, wc->block_n);
    if (tm > tau)
        tau = tm;
    double total = 0.0;
    splits = splits > 1 ? splits : 0;
    const double ms = predict_ms(
        dev, d, f, wc->gather ? STOF_KERNEL_ROWWISE : STOF_KERNEL_BLOCK,
        wc->block_n, tau, o, MU_PARTIAL_WGMMA, 1, wc->persist, splits,
        bm == 192 ? 3 : 1, &total);
    if (out) {
        memset(out, 0, sizeof(*out));
        out->kind = wc->gather ? STOF_KERNEL_WGMMA_GATHER : STOF_KERNEL_WGMMA;
        out->cfg.block_m = bm;
        out->cfg.block_n = wc->block_n;
        out->cfg.warps = bm == 64 ? 8 : bm == 192 ? 16 : 12;
        out->cfg.stages = wc->stages;
        out->cfg.split = splits > 1;
        out->wcfg = *wc;
        out->wcfg.split = splits > 1;
        out->predicted_ms = ms;
        out->work_tiles = total;
        out->ctas_per_sm = o;
        out->splits = splits;
    }
    return ms;
}

double stof__cost_predict_wgmma(const stof_device *dev,
                                const stof_attention_desc *d,
                                const stof_format *f, const stof_wgmma_cfg *wc,
                                stof_candidate *out)
{
    return predict_wgmma(dev, d, f, wc, 0, out);
}

double stof__cost_predict_split(const stof_device *dev,
                                const stof_attention_desc *d,
                                const stof_format *f,
                                const stof_candidate *base, int splits,
                                stof_candidate *out)
{
    const stof_candidate b = *base; /* out may be base */
    double ms;
    if (b.kind == STOF_KERNEL_WGMMA || b.kind == STOF_KERNEL_WGMMA_GATHER)
        ms = predict_wgmma(dev, d, f, &b.wcfg, splits, out);
    else
        ms = predict_block(dev, d, f, b.kind, &b.cfg, splits, out);
    if (out)
        out->group = b.group;
    return ms;
}

int stof__cost_split_counts(const stof_device *dev,
                            const stof_attention_desc *d, const stof_format *f,
                            int ctas_per_sm, int *counts)
{
    int max_tiles = 0;
    for (int i = 0; i < f->n_row_blocks; i++) {
        const int64_t t = f->row_ptr[i + 1] - f->row_ptr[i];
        if (t > max_tiles)
            max_tiles = t > INT32_MAX ? INT32_MAX : (int)t;
    }
    const int64_t slots =
        (int64_t)(dev->sm_count > 0 ? dev->sm_count : 1) *
        (ctas_per_sm > 0 ? ctas_per_sm : 1);
    const int64_t ctas =
        (int64_t)f->n_row_blocks * d->batch * d->heads;
    int n = 0;
    /* Only when the unsplit grid leaves SMs idle for much of the time (at
     * most two waves), each CTA keeps at least two tiles, the grid at most
     * four waves and the partials at most 256 MB. */
    if (ctas >= 2 * slots)
        return 0;
    for (int s = 2; s <= STOF_SPLIT_MAX; s *= 2) {
        if (2 * s > max_tiles || ctas * s > 4 * slots)
            break;
        if (stof__split_bytes(s, d) > ((size_t)256 << 20))
            break;
        counts[n++] = s;
    }
    return n;
}

static int cmp_cand(const void *a, const void *b)
{
    const stof_candidate *x = a, *y = b;
    return (x->predicted_ms > y->predicted_ms) -
           (x->predicted_ms < y->predicted_ms);
}

/* The next free element of a growing candidate array, or NULL when out of
 * memory. */
static stof_candidate *next_slot(stof_candidate **all, int *count, int *cap)
{
    if (*count == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        stof_candidate *p = realloc(*all, sizeof(**all) * (size_t)nc);
        if (!p)
            return NULL;
        *all = p;
        *cap = nc;
    }
    return &(*all)[(*count)++];
}

/* After the candidate just added (the last of *all): its split-KV
 * variants worth ranking (stof__cost_split_counts). 0, or -1 when out of
 * memory. */
static int add_splits(const stof_device *dev, const stof_attention_desc *d,
                      const stof_format *f, stof_candidate **all, int *count,
                      int *cap)
{
    const stof_candidate base = (*all)[*count - 1];
    int counts[8];
    const int n = stof__cost_split_counts(dev, d, f, base.ctas_per_sm, counts);
    for (int i = 0; i < n; i++) {
        stof_candidate *slot = next_slot(all, count, cap);
        if (!slot)
            return -1;
        stof__cost_predict_split(dev, d, f, &base, counts[i], slot);
    }
    return 0;
}

/* Rank wgmma configuration wc on f (skipped when the device cannot run
 * it) and, with splits, its split-KV variants. 0, or -1 when out of
 * memory. */
static int add_wgmma(const stof_device *dev, const stof_attention_desc *d,
                     const stof_format *f, const stof_wgmma_cfg *wc,
                     int group, int splits, stof_candidate **all, int *count,
                     int *cap)
{
    if (!stof__wgmma_cfg_valid(dev, d->head_dim, wc, NULL, 0))
        return 0;
    stof_candidate *slot = next_slot(all, count, cap);
    if (!slot)
        return -1;
    stof__cost_predict_wgmma(dev, d, f, wc, slot);
    slot->group = group;
    return splits ? add_splits(dev, d, f, all, count, cap) : 0;
}

static stof_status mask_format(void *user, int block_m, int block_n,
                               stof_format **f)
{
    const stof_mask *m = ((void **)user)[1];
    return stof_format_build(((void **)user)[0], m, block_m, block_n, f);
}

/* Rank every candidate on the formats of make (group 1) and, when the
 * mask's rows group by a period, on those of the grouped mask (row-wise
 * kinds only); without rowwise_ok, the block-format kinds only. */
static stof_status rank_on(stof_context *ctx, const stof_attention_desc *d,
                           stof_format_fn make, void *user, int group,
                           int rowwise_ok, stof_candidate **all, int *count,
                           int *cap)
{
    static const int bms[] = {64, 128}, bns[] = {32, 64, 128}, ws[] = {4, 8},
                     ss[] = {1, 2, 3};
    const int wgmma_ok = stof__wgmma_device_ok(&ctx->device) &&
                         !(d->scale < 0.0f) && stof__wgmma_strides_ok(d);
    /* Kernels built for the problem's score modifiers; ALiBi and the bias
     * tensor need key indices, which the gather kernels do not have. */
    const int mods = stof__attn_mods(d);
    if (mods & STOF_MOD_BLOCK_ONLY)
        rowwise_ok = 0;
    for (int a = 0; a < 2; a++) {
        for (int b = 0; b < 3; b++) {
            stof_format *f = NULL;
            stof_status st = make(user, bms[a], bns[b], &f);
            if (st != STOF_OK)
                return st;
            /* mma.sync: block-wise (ungrouped only) and row-wise. */
            for (int x = 0; x < 2; x++)
                for (int y = 0; y < 3; y++) {
                    stof_block_cfg c = {.block_m = bms[a], .block_n = bns[b],
                                        .warps = ws[x], .stages = ss[y],
                                        .mods = mods};
                    for (int kind = STOF_KERNEL_BLOCK;
                         kind <= STOF_KERNEL_ROWWISE; kind++) {
                        if ((kind == STOF_KERNEL_BLOCK && group > 1) ||
                            (kind == STOF_KERNEL_ROWWISE && !rowwise_ok))
                            continue;
                        /* Checked per kind: the row-wise build's key
                         * offsets take shared memory of their own. */
                        c.gather = kind == STOF_KERNEL_ROWWISE;
                        if (!stof__block_cfg_valid(&ctx->device, d->head_dim,
                                                   &c, NULL, 0))
                            continue;
                        stof_candidate *slot = next_slot(all, count, cap);
                        if (!slot)
                            goto oom;
                        stof__cost_predict(&ctx->device, d, f, kind, &c, slot);
                        slot->group = group;
                        if (add_splits(&ctx->device, d, f, all, count, cap))
                            goto oom;
                    }
                }
            /* wgmma: 64- or 128-row CTAs, block-wise and gather. */
            for (int g = 0; wgmma_ok && g < 2; g++) {
                if ((g == 0 && group > 1) || (g == 1 && !rowwise_ok))
                    continue;
                /* Block mode also as the persistent kernel (not split). */
                for (int y = 0; y < 3 * (2 - g); y++) {
                    const stof_wgmma_cfg wc = {.block_n = bns[b],
                                               .stages = 2 + y % 3,
                                               .overlap = 1, .gather = g,
                                               .block_m = bms[a], .mods = mods,
                                               .persist = y >= 3};
                    if (add_wgmma(&ctx->device, d, f, &wc, group, !wc.persist,
                                  all, count, cap))
                        goto oom;
                }
            }
            /* 64 x 64 at head_dim 64 without the overlap: four CTAs an SM
             * (stof__wgmma_ctas_per_sm), ordinary and persistent. */
            for (int y = 0; wgmma_ok && group == 1 && bms[a] == 64 &&
                            bns[b] == 64 && d->head_dim == 64 && y < 2;
                 y++) {
                const stof_wgmma_cfg wc = {.block_n = 64, .stages = 2,
                                           .overlap = 0, .block_m = 64,
                                           .mods = mods, .persist = y};
                if (add_wgmma(&ctx->device, d, f, &wc, group, !wc.persist,
                              all, count, cap))
                    goto oom;
            }
            /* wgmma 192-row CTAs on the 64-row format, where every
             * three row blocks list the same full tiles (a mask's own
             * formats only: families' are built on the GPU, unchecked). */
            if (wgmma_ok && group == 1 && make == mask_format &&
                bms[a] == 64 && bns[b] == 128 && d->head_dim == 64 &&
                stof__wgmma_uniform_triples(f))
                for (int y = 0; y < 4; y++) {
                    const stof_wgmma_cfg wc = {.block_n = 128,
                                               .stages = 2 + y % 2,
                                               .overlap = 1, .block_m = 192,
                                               .mods = mods,
                                               .persist = y >= 2};
                    if (add_wgmma(&ctx->device, d, f, &wc, group, 0, all,
                                  count, cap))
                        goto oom;
                }
            stof_format_free(&f);
            continue;
        oom:
            stof_format_free(&f);
            return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                              "out of memory ranking kernels");
        }
    }
    return STOF_OK;
}

/* Sort the candidates (fastest first) and keep the first max. */
static stof_status rank_finish(stof_status st, stof_candidate *all, int count,
                               stof_candidate *cands, int max, int *n)
{
    if (st == STOF_OK && count == 0)
        st = STOF_ERR_UNSUPPORTED;
    if (st == STOF_OK) {
        qsort(all, (size_t)count, sizeof(*all), cmp_cand);
        *n = count < max ? count : max;
        memcpy(cands, all, sizeof(*all) * (size_t)*n);
    }
    free(all);
    return st;
}

stof_status stof__cost_rank(stof_context *ctx, const stof_attention_desc *d,
                            const stof_mask *m, stof_candidate *cands,
                            int max, int *n)
{
    *n = 0;
    stof_candidate *all = NULL;
    int count = 0, cap = 0;
    /* The gather kernels keep K/V row offsets in 16-byte units in 32
     * bits. */
    const int64_t kv_stride = d->k_stride[2] > d->v_stride[2] ? d->k_stride[2]
                                                              : d->v_stride[2];
    const int rowwise_ok = (double)(d->seq_k - 1) * (double)kv_stride / 8.0 <
                           4294967296.0;
    void *u[2] = {ctx, (void *)m};
    stof_status st = rank_on(ctx, d, mask_format, u, 1, rowwise_ok, &all,
                             &count, &cap);
    const int period = rowwise_ok ? stof__mask_row_period(m) : 1;
    if (st == STOF_OK && period > 1) {
        stof_mask *g = NULL;
        int32_t *perm = NULL;
        st = stof__mask_group_rows(ctx, m, period, &g, &perm);
        void *ug[2] = {ctx, g};
        if (st == STOF_OK)
            st = rank_on(ctx, d, mask_format, ug, period, 1, &all, &count,
                         &cap);
        stof_mask_free(&g);
        free(perm);
    }
    return rank_finish(st, all, count, cands, max, n);
}

stof_status stof__cost_rank_formats(stof_context *ctx,
                                   const stof_attention_desc *d,
                                   stof_format_fn make, void *user,
                                   stof_candidate *cands, int max, int *n)
{
    *n = 0;
    stof_candidate *all = NULL;
    int count = 0, cap = 0;
    stof_status st = rank_on(ctx, d, make, user, 1, 0, &all, &count, &cap);
    return rank_finish(st, all, count, cands, max, n);
}
