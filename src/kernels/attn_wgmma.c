/*
 * attn_wgmma.c - host side of the Hopper block-wise sparse attention kernel
 * (jit_templates/attn_wgmma.cu): configuration rules, shared memory,
 * compile + load for sm_90a, the TMA tensor maps and the launch.
 * Declarations and contracts: attn_wgmma.h.
 */
#include "attn_wgmma.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Mirrors struct stof_attn_wgmma_params in jit_templates/attn_wgmma.cu
 * (same field order and types); both sides check the size. */
typedef struct stof_attn_wgmma_params {
    CUtensorMap tm_q, tm_k, tm_v;
    CUdeviceptr o;
    CUdeviceptr row_ptr, col_idx, kind, bitmap_idx, bitmaps, row_order;
    int64_t o_stride[3];
    int batch, heads, seq_q, seq_k;
    int n_row_blocks, bitmap_words_per_row;
    float scale_log2;
    int rp_stride;
    int kv_group;   /* query heads per K/V head (GQA) */
    int persist_hg; /* persistent: (batch, head) pairs a group, 0: one */
    /* gather mode only */
    CUdeviceptr q, k, v;
    CUdeviceptr key_ptr, keys, q_rows;
    int64_t q_stride[3], k_stride[3], v_stride[3];
    CUdeviceptr lse; /* 0, or float[batch][heads][seq_q] */
    CUdeviceptr o_part, lse_part; /* split kernels (attn_split.h) */
    int n_split;
    float cap_in, cap_out; /* SOFTCAP: scale / softcap, softcap * log2(e) */
    int pad2_;
    CUdeviceptr alibi;     /* ALIBI: float[heads] */
    CUdeviceptr bias;      /* BIAS: the additive bias (16-bit) */
    int64_t bias_stride[3];
    CUdeviceptr sched;     /* persistent: 0, or the list schedule */
    CUdeviceptr k_lim;     /* 0, or int32[batch]: keys of V read (k_len) */
    uint8_t tail_[40];     /* to the maps' alignment, as the template */
    CUtensorMap tm_o;      /* block mode: O, boxes of 64 rows */
} stof_attn_wgmma_params;
_Static_assert(sizeof(stof_attn_wgmma_params) == 896,
               "stof_attn_wgmma_params must match attn_wgmma.cu");
_Static_assert(offsetof(stof_attn_wgmma_params, o) == 384,
               "stof_attn_wgmma_params must match attn_wgmma.cu");
_Static_assert(offsetof(stof_attn_wgmma_params, q) == 504,
               "stof_attn_wgmma_params must match attn_wgmma.cu");
_Static_assert(offsetof(stof_attn_wgmma_params, lse) == 624,
               "stof_attn_wgmma_params must match attn_wgmma.cu");
_Static_assert(offsetof(stof_attn_wgmma_params, tm_o) == 768,
               "stof_attn_wgmma_params must match attn_wgmma.cu");

/* The largest opt-in shared memory of a cc 9.0 GPU (227 KiB). */
#define WGMMA_SMEM_MAX (227 * 1024)


int stof__wgmma_block_m(const stof_wgmma_cfg *c)
{
    return c && (c->block_m == 64 || c->block_m == 192) ? c->block_m
                                                          : STOF_WGMMA_BLOCK_M;
}

int stof__wgmma_format_block_m(const stof_wgmma_cfg *c)
{
    const int bm = stof__wgmma_block_m(c);
    return bm == 192 ? 64 : bm;
}

int stof__wgmma_row_blocks(const stof_wgmma_cfg *c, int seq_q)
{
    const int bm = stof__wgmma_block_m(c);
    return seq_q > 0 ? (int)(((int64_t)seq_q + bm - 1) / bm) : 0;
}

int stof__wgmma_uniform_triples(const stof_format *f)
{
    if (!f || !f->row_ptr || f->block_m != 64 || f->n_row_blocks < 1 ||
        (f->row_ptr[f->n_row_blocks] > 0 && !f->kind))
        return 0;
    for (int64_t e = 0; e < f->row_ptr[f->n_row_blocks]; e++)
        if (f->kind[e] != STOF_TILE_FULL)
            return 0;
    /* Every row block listing every key block: the same lists (a format
     * lists a row block's key blocks once each), no need to read them. */
    int all = 1;
    for (int r = 0; r < f->n_row_blocks && all; r++)
        all = f->row_ptr[r + 1] - f->row_ptr[r] == f->n_col_blocks;
    if (all)
        return 1;
    if (!f->col_idx)
        return 0;
    for (int g = 0; 3 * g < f->n_row_blocks; g++) {
        const int r0 = 3 * g;
        const int64_t b0 = f->row_ptr[r0], n0 = f->row_ptr[r0 + 1] - b0;
        for (int r = r0 + 1; r < r0 + 3 && r < f->n_row_blocks; r++) {
            const int64_t b = f->row_ptr[r];
            if (f->row_ptr[r + 1] - b != n0 ||
                memcmp(f->col_idx + b, f->col_idx + b0,
                       sizeof(*f->col_idx) * (size_t)n0) != 0)
                return 0;
        }
    }
    return 1;
}

size_t stof__wgmma_smem_bytes(int head_dim, const stof_wgmma_cfg *c)
{
    if (!c || head_dim <= 0 || c->block_n <= 0 || c->stages <= 0)
        return 0;
    const size_t row = (size_t)head_dim * 2u;
    const size_t s = (size_t)c->stages;
    const size_t bm = (size_t)stof__wgmma_block_m(c);
    size_t bytes = bm * row;                                   /* Q */
    bytes += 2u * s * (size_t)c->block_n * row;                /* K, V */
    bytes += s * bm * (size_t)(c->block_n / 32) * 4u;          /* bits */
    bytes += 8u * (1u + 4u * s);                               /* mbarriers */
    if (c->persist)
        bytes += bm * row + 8u * 3u + 32u;     /* second Q, its barriers,
                                                  the buffers' work items */
    bytes += 8u * s;                                           /* meta */
    if (c->gather)
        bytes += 2u * 2u * (size_t)c->block_n * 4u;            /* offsets */
    return bytes + 1024u;                                      /* alignment */
}

int stof__wgmma_cfg_valid(const stof_device *dev, int head_dim,
                          const stof_wgmma_cfg *c, char *why, size_t n)
{
    if (why && n)
        why[0] = '\0';
    if (!c)
        return stof__why(why, n, "no configuration (NULL)");
    if (head_dim != 64 && head_dim != 128 && head_dim != 256)
        return stof__why(why, n,
                       "head_dim %d: the wgmma kernel supports 64, 128 and "
                       "256",
                       head_dim);
    if (c->block_n != 64 && c->block_n != 128)
        return stof__why(why, n, "block_n %d: must be 64 or 128", c->block_n);
    if (c->stages < 2 || c->stages > 4)
        return stof__why(why, n, "stages %d: must be 2..4", c->stages);
    if (c->overlap != 0 && c->overlap != 1)
        return stof__why(why, n, "overlap %d: must be 0 or 1", c->overlap);
    if (!stof__attn_options_valid(c->gather, c->split, c->mods, why, n))
        return 0;
    if (c->persist != 0 && c->persist != 1)
        return stof__why(why, n, "persist %d: must be 0 or 1", c->persist);
    if (c->persist && (c->gather || c->split))
        return stof__why(why, n,
                         "the persistent kernel is block mode only, without "
                         "split-KV");
    if (c->block_m != 0 && c->block_m != 64 && c->block_m != 128 &&
        c->block_m != 192)
        return stof__why(why, n, "block_m %d: must be 64, 128 or 192 (0: 128)",
                       c->block_m);
    /* 192 rows: three consumer warpgroups at 160 registers a thread fit
     * head_dim 64's accumulators (ptxas, without spills; with ALiBi and
     * the bias tensor they spill). */
    if (c->block_m == 192 &&
        (head_dim != 64 || c->gather || c->split ||
         (c->mods & STOF_MOD_BLOCK_ONLY)))
        return stof__why(why, n,
                         "block_m 192: head_dim 64, block mode, no split-KV, "
                         "no ALiBi or bias tensor (head_dim %d%s%s%s)",
                         head_dim, c->gather ? ", gather" : "",
                         c->split ? ", split" : "",
                         c->mods & STOF_MOD_BLOCK_ONLY ? ", ALiBi/bias" : "");
    /* head_dim 256: 128 O accumulators a consumer thread leave room for
     * 64-key S tiles only, in 128-row CTAs (two consumer warpgroups), two
     * stages, TMA loads. */
    if (head_dim == 256 &&
        (stof__wgmma_block_m(c) != 128 || c->block_n != 64 ||
         c->stages != 2 || c->gather))
        return stof__why(why, n,
                         "head_dim 256: the wgmma kernel needs block_m 128, "
                         "block_n 64, 2 stages and block mode (not "
                         "%dx%d, %d stages%s)",
                         stof__wgmma_block_m(c), c->block_n, c->stages,
                         c->gather ? ", gather" : "");
    const size_t smem = stof__wgmma_smem_bytes(head_dim, c);
    const size_t lim = dev && dev->ok && dev->max_smem_optin > 0
                           ? (size_t)dev->max_smem_optin
                           : (size_t)WGMMA_SMEM_MAX;
    if (smem > lim)
        return stof__why(why, n,
                       "head_dim %d, block_n %d, %d stages: %zu bytes of "
                       "shared memory, more than the %zu the %s allows",
                       head_dim, c->block_n, c->stages, smem, lim,
                       dev && dev->ok ? "device" : "largest cc 9.0 GPU");
    return 1;
}

int stof__wgmma_device_ok(const stof_device *dev)
{
    return dev && dev->ok && dev->cc_major == 9 && dev->cc_minor == 0;
}

int stof__wgmma_ctas_per_sm(int head_dim, const stof_wgmma_cfg *c)
{
    /* 228 KB of shared memory per SM on cc 9.0, 1 KB of it reserved per
     * CTA; the registers allow three 64-row CTAs of head_dim 64 with
     * 64-key tiles (four without the overlap, two stages, block mode),
     * two other 64-row CTAs, one 128-row CTA (WG_MIN_BLOCKS in
     * attn_wgmma.cu). */
    const size_t smem = stof__wgmma_smem_bytes(head_dim, c) + 1024u;
    if (stof__wgmma_block_m(c) != 64)
        return 1;
    const int occ3 = head_dim == 64 && c->block_n == 64;
    const int regs = occ3 && !c->overlap && c->stages == 2 && !c->gather ? 4
                     : occ3                                              ? 3
                                                                         : 2;
    const int by_smem = (int)((228u * 1024u) / smem);
    return by_smem < 1 ? 1 : by_smem < regs ? by_smem : regs;
}

int stof__wgmma_persist_ctas(const stof_device *dev, int head_dim,
                             const stof_wgmma_cfg *c)
{
    const int sms = dev && dev->ok && dev->sm_count > 0 ? dev->sm_count : 1;
    return sms * stof__wgmma_ctas_per_sm(head_dim, c);
}

int stof__wgmma_persist_group(const stof_device *dev,
                              const stof_attention_desc *d)
{
    const int64_t bh = (int64_t)d->batch * d->heads;
    const int g = stof__kv_group(d);
    /* K and V of one query head (a K/V head shared by g of them). */
    const int64_t per = (int64_t)d->seq_k * d->head_dim * 4 / g;
    /* A third of the L2 (the rest: Q, O, the next group's first loads). */
    const int64_t l2 = dev && dev->ok && dev->l2_bytes > 0
                           ? dev->l2_bytes
                           : (int64_t)48 << 20;
    int64_t hg = per > 0 ? l2 / 3 / per : bh;
    hg -= hg % g; /* whole K/V heads */
    if (hg < g)
        hg = g;
    return hg >= bh ? 0 : (int)hg;
}

double stof__wgmma_persist_deal_max(const double *w, int nrb, int64_t bh,
                                    int hg, int slots, double over,
                                    double *t)
{
    memset(t, 0, sizeof(*t) * (size_t)slots);
    const int64_t g = hg == 0 ? bh : hg > 0 ? hg : -(int64_t)hg;
    const int64_t gn = g < bh ? g : bh;
    /* Item k of the deal goes to slot k % slots, every other round
     * reversed (a snake). Group by group of gn (batch, head)s: hg >= 0 rank
     * by rank; hg < 0 pairs of ranks i, nrb - 1 - i; each over the group's
     * heads. Counters, not divisions: 6144 items dealt three ways took
     * ~0.7 ms of a plan with two 64-bit divisions an item. */
    const int pairs = hg < 0;
    const int nr = pairs ? (nrb + 1) / 2 : nrb;
    int64_t x = 0;
    int odd = 0;
    for (int64_t g0 = 0; g0 < bh; g0 += gn) {
        const int64_t n = bh - g0 < gn ? bh - g0 : gn;
        for (int i = 0; i < nr; i++) {
            const int i2 = nrb - 1 - i;
            const double add =
                w[i] + over + (pairs && i2 != i ? w[i2] + over : 0.0);
            for (int64_t b = 0; b < n; b++) {
                t[odd ? slots - 1 - x : x] += add;
                if (++x == slots) {
                    x = 0;
                    odd ^= 1;
                }
            }
        }
    }
    double m = 0.0;
    for (int i = 0; i < slots; i++)
        if (t[i] > m)
            m = t[i];
    return m;
}

/* The slots by load: each distinct load (exactly, as a double) a level
 * holding its slots as a bitset, the levels in ascending order. Dealing n
 * items of one weight c to "the least loaded slot, the lowest of equal
 * ones" one at a time is then a few batches: the lowest slots of the
 * lowest level take the items in index order and move, together, to the
 * level of that load plus c (the same double for each: they added the
 * same c to the same value). A binary heap, then a tournament tree, took
 * 0.4-0.9 and 0.2-0.5 ms of a plan for 6144 items on 396 slots; this is
 * the same deal, item for item. */
typedef struct slot_levels {
    int slots, words;
    int n, cap;       /* levels in use, allocated */
    double *t;        /* t[l]: level l's load, ascending */
    int *count;       /* its slots */
    uint64_t *bits;   /* words a level: its slots */
    uint64_t *taken;  /* a batch's slots (words) */
} slot_levels;

static void levels_free(slot_levels *L)
{
    free(L->t);
    free(L->count);
    free(L->bits);
    free(L->taken);
}

static int levels_init(slot_levels *L, int slots)
{
    memset(L, 0, sizeof(*L));
    L->slots = slots;
    L->words = (slots + 63) / 64;
    L->cap = slots + 1; /* distinct loads: at most one a slot */
    L->t = malloc(sizeof(double) * (size_t)L->cap);
    L->count = malloc(sizeof(int) * (size_t)L->cap);
    L->bits = calloc((size_t)L->cap * (size_t)L->words, sizeof(uint64_t));
    L->taken = calloc((size_t)L->words, sizeof(uint64_t));
    if (!L->t || !L->count || !L->bits || !L->taken)
        return 0;
    L->n = 1; /* every slot at load 0 */
    L->t[0] = 0.0;
    L->count[0] = slots;
    for (int s = 0; s < slots; s++)
        L->bits[s / 64] |= 1ull << (s % 64);
    return 1;
}

/* Level l and those above it, one place up or down (dir +1: open a slot
 * at l; -1: close level l). */
static void levels_shift(slot_levels *L, int l, int dir)
{
    const size_t w = (size_t)L->words;
    const int from = dir > 0 ? l : l + 1, to = from + dir;
    const int cnt = L->n - from;
    memmove(&L->t[to], &L->t[from], sizeof(double) * (size_t)cnt);
    memmove(&L->count[to], &L->count[from], sizeof(int) * (size_t)cnt);
    memmove(&L->bits[(size_t)to * w], &L->bits[(size_t)from * w],
            sizeof(uint64_t) * w * (size_t)cnt);
    L->n += dir;
}

/* Deal m items of weight c; item i's slot into at[i]. */
static void levels_deal(slot_levels *L, int64_t m, double c, int32_t *at,
                        int64_t *fill)
{
    const size_t w = (size_t)L->words;
    while (m > 0) {
        uint64_t *low = &L->bits[0];
        if (!(c > 0.0)) { /* (no load added: every item to one slot) */
            int s = 0;
            while (!low[s / 64])
                s += 64;
            s += __builtin_ctzll(low[s / 64]);
            for (; m > 0; m--) {
                *at++ = s;
                fill[s + 1]++;
            }
            return;
        }
        /* The batch: the lowest min(m, count) slots of the lowest level. */
        const int take = m < L->count[0] ? (int)m : L->count[0];
        memset(L->taken, 0, sizeof(uint64_t) * w);
        for (int i = 0, x = 0; i < take; x++) {
            while (low[x] && i < take) {
                const int b = __builtin_ctzll(low[x]);
                const int s = x * 64 + b;
                low[x] &= low[x] - 1;
                L->taken[x] |= 1ull << b;
                *at++ = s;
                fill[s + 1]++;
                i++;
            }
        }
        m -= take;
        const double t = L->t[0] + c;
        L->count[0] -= take;
        if (L->count[0] == 0)
            levels_shift(L, 0, -1);
        /* Their level: an existing one of exactly that load, or a new one
         * in order. */
        int l = 0;
        while (l < L->n && L->t[l] < t)
            l++;
        if (l == L->n || L->t[l] != t) {
            levels_shift(L, l, +1);
            L->t[l] = t;
            L->count[l] = 0;
            memset(&L->bits[(size_t)l * w], 0, sizeof(uint64_t) * w);
        }
        for (size_t x = 0; x < w; x++)
            L->bits[(size_t)l * w + x] |= L->taken[x];
        L->count[l] += take;
    }
}

int32_t *stof__wgmma_persist_list(const double *w, int nrb, int64_t bh,
                                  int hg, int slots, double over, size_t *n)
{
    *n = 0;
    const int64_t items = (int64_t)nrb * bh;
    if (!w || nrb < 1 || bh < 1 || slots < 1 || items > STOF_PERSIST_LIST_MAX)
        return NULL;
    const int64_t gn = hg > 0 && hg < bh ? hg : bh;
    int32_t *out = malloc(sizeof(int32_t) * ((size_t)slots + 1 + (size_t)items));
    int32_t *at = malloc(sizeof(int32_t) * (size_t)items); /* item's slot */
    int64_t *fill = calloc((size_t)slots + 1, sizeof(int64_t));
    slot_levels lv;
    const int lv_ok = levels_init(&lv, slots);
    if (!out || !at || !fill || !lv_ok) {
        free(out);
        out = NULL;
        goto done;
    }
    /* Group by group; in a group rank by rank (heaviest first), head by
     * head; each item to the least loaded slot. k: the deal's order. */
    int64_t k = 0;
    for (int64_t g0 = 0; g0 < bh; g0 += gn) {
        const int64_t ge = g0 + gn < bh ? g0 + gn : bh;
        for (int r = 0; r < nrb; r++, k += ge - g0)
            levels_deal(&lv, ge - g0, w[r] + over, at + k, fill);
    }
    /* Each slot's items in the deal's order. */
    for (int i = 0; i < slots; i++)
        fill[i + 1] += fill[i];
    for (int i = 0; i <= slots; i++)
        out[i] = (int32_t)fill[i];
    int32_t *list = out + slots + 1;
    k = 0;
    for (int64_t g0 = 0; g0 < bh; g0 += gn) {
        const int64_t ge = g0 + gn < bh ? g0 + gn : bh;
        for (int r = 0; r < nrb; r++)
            for (int64_t b = g0; b < ge; b++, k++)
                list[fill[at[k]]++] = (int32_t)((int64_t)r * bh + b);
    }
    *n = (size_t)slots + 1 + (size_t)items;
done:
    free(at);
    levels_free(&lv);
    free(fill);
    return out;
}

static int cmp_double_desc(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

int stof__wgmma_persist_heads(const stof_device *dev,
                              const stof_attention_desc *d,
                              const double *row_work, int nrb, int slots)
{
    const int hg = stof__wgmma_persist_group(dev, d);
    if (hg <= 0 || !row_work || nrb < 1 || slots < 1)
        return 0;
    const int64_t bh = (int64_t)d->batch * d->heads;
    double *w = malloc(sizeof(double) * (size_t)nrb);
    double *t = malloc(sizeof(double) * (size_t)slots);
    int sched = 0;
    if (w && t) {
        memcpy(w, row_work, sizeof(double) * (size_t)nrb);
        qsort(w, (size_t)nrb, sizeof(double), cmp_double_desc);
        double mean = 0.0;
        for (int i = 0; i < nrb; i++)
            mean += w[i];
        mean /= nrb;
        /* An item's fixed cost: about half a mean row block's work. */
        const double one =
            stof__wgmma_persist_deal_max(w, nrb, bh, 0, slots, mean / 2, t);
        const double grp =
            stof__wgmma_persist_deal_max(w, nrb, bh, hg, slots, mean / 2, t);
        const double pair =
            stof__wgmma_persist_deal_max(w, nrb, bh, -hg, slots, mean / 2, t);
        /* The L2 is worth a few percent of balance (measured, dense: the
         * grouped deal 3-10% faster at the same balance). */
        sched = grp <= pair ? (grp <= one * 1.03 ? hg : 0)
                            : (pair <= one * 1.03 ? -hg : 0);
    }
    free(w);
    free(t);
    return sched;
}

/* Check (head_dim, dt, c) for this device; STOF_OK or a recorded error. */
static stof_status wgmma_check(stof_context *ctx, int head_dim, stof_dtype dt,
                               const stof_wgmma_cfg *c)
{
    STOF_CHECK_ARG(ctx, dt == STOF_DTYPE_FP16 || dt == STOF_DTYPE_BF16,
                   "dtype %d is not a stof_dtype", (int)dt);
    char why[256];
    if (!stof__wgmma_cfg_valid(ctx->device.ok ? &ctx->device : NULL,
                               head_dim, c, why, sizeof(why)))
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "wgmma kernel configuration not supported: %s",
                          why);
    if (!ctx->device.ok)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE,
                          "the wgmma kernel needs a GPU: no usable CUDA "
                          "device in this context");
    if (!stof__wgmma_device_ok(&ctx->device))
        return stof__fail(ctx, STOF_ERR_UNSUPPORTED,
                          "the wgmma kernel needs compute capability 9.0 "
                          "(sm_90a); %s is %d.%d",
                          ctx->device.name, ctx->device.cc_major,
                          ctx->device.cc_minor);
    return STOF_OK;
}

stof_status stof__wgmma_compile(stof_context *ctx, int head_dim,
                                stof_dtype dt, const stof_wgmma_cfg *c,
                                void **cubin, size_t *size)
{
    return stof__wgmma_compile_with(ctx, head_dim, dt, c, NULL, cubin, size);
}

stof_status stof__wgmma_compile_with(stof_context *ctx, int head_dim,
                                     stof_dtype dt, const stof_wgmma_cfg *c,
                                     const char *extra, void **cubin,
                                     size_t *size)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    *cubin = NULL;
    *size = 0;
    stof_status st = wgmma_check(ctx, head_dim, dt, c);
    if (st != STOF_OK)
        return st;
    char d_hd[32], d_dt[32], d_bn[32], d_s[32], d_o[32];
    snprintf(d_hd, sizeof(d_hd), "HEAD_DIM=%d", head_dim);
    snprintf(d_dt, sizeof(d_dt), "DTYPE=%d", (int)dt);
    snprintf(d_bn, sizeof(d_bn), "BLOCK_N=%d", c->block_n);
    snprintf(d_s, sizeof(d_s), "STAGES=%d", c->stages);
    snprintf(d_o, sizeof(d_o), "OVERLAP=%d", c->overlap);
    /* GATHER, BLOCK_M and PERSIST are defined only when they differ from
     * the defaults: the 128-row block-mode kernels compile from exactly
     * the defines they always had. */
    const char *defs[13] = {d_hd, d_dt, d_bn, d_s, d_o};
    int n_defs =
        stof__attn_option_defines(c->gather, c->split, c->mods, defs, 5);
    if (stof__wgmma_block_m(c) == 64)
        defs[n_defs++] = "BLOCK_M=64";
    else if (stof__wgmma_block_m(c) == 192)
        defs[n_defs++] = "BLOCK_M=192";
    if (c->persist)
        defs[n_defs++] = "PERSIST=1";
    if (extra)
        defs[n_defs++] = extra;
    return (stof_status)stof__jit_compile(ctx, "attn_wgmma.cu", defs, n_defs,
                                          "sm_90a", cubin, size);
}

stof_status stof__wgmma_load_cubin(stof_context *ctx, int head_dim,
                                   const stof_wgmma_cfg *c, const void *cubin,
                                   CUmodule *mod, CUfunction *fn)
{
    return stof__wgmma_load_cubin_shared(ctx, head_dim, c, cubin, 0, 0, mod,
                                          fn);
}

stof_status stof__wgmma_load_cubin_shared(stof_context *ctx, int head_dim,
                                          const stof_wgmma_cfg *c,
                                          const void *cubin, size_t size,
                                          uint64_t hash, CUmodule *mod,
                                          CUfunction *fn)
{
    /* (size 0: loaded apart, not through the cache) */
    return (stof_status)stof__module_load_shared_hashed(
        ctx, cubin, size, hash, "stof_attn_wgmma",
        stof__wgmma_smem_bytes(head_dim, c), mod, fn);
}

stof_status stof__wgmma_load(stof_context *ctx, int head_dim, stof_dtype dt,
                             const stof_wgmma_cfg *c, CUmodule *mod,
                             CUfunction *fn)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, mod && fn, "mod, fn: NULL output pointer");
    *mod = NULL;
    *fn = NULL;
    void *cubin = NULL;
    size_t size = 0;
    stof_status st = stof__wgmma_compile(ctx, head_dim, dt, c, &cubin, &size);
    if (st == STOF_OK)
        st = stof__wgmma_load_cubin(ctx, head_dim, c, cubin, mod, fn);
    free(cubin);
    return st;
}

/* ------------------------------------------------------------------------ */
/* TMA tensor maps                                                           */
/* ------------------------------------------------------------------------ */

/* A 4-D map over (head_dim, seq, heads, batch) of 16-bit elements, boxes of
 * 64 columns x box_rows rows, 128-byte swizzle, zero fill out of bounds. */
static CUresult make_map(stof_encode_tiled_fn enc, CUtensorMap *m,
                         stof_dtype dt, CUdeviceptr base, int head_dim,
                         int seq, int heads, int batch, const int64_t st[3],
                         unsigned box_rows)
{
    const cuuint64_t dims[4] = {(cuuint64_t)head_dim, (cuuint64_t)seq,
                                (cuuint64_t)heads, (cuuint64_t)batch};
    /* A dimension of size 1 is never stepped: any legal stride does. */
    const cuuint64_t strides[3] = {
        (cuuint64_t)st[2] * 2u,
        heads > 1 ? (cuuint64_t)st[1] * 2u : 16u,
        batch > 1 ? (cuuint64_t)st[0] * 2u : 16u,
    };
    const cuuint32_t box[4] = {64u, box_rows, 1u, 1u};
    const cuuint32_t estr[4] = {1u, 1u, 1u, 1u};
    return enc(m,
               dt == STOF_DTYPE_FP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                     : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
               4u, (void *)(uintptr_t)base, dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

/* Strides usable by the kernel: non-negative multiples of 8 elements, the
 * sequence stride positive when the sequence has more than one row, and
 * small enough for the TMA (< 2^40 bytes). */
static int strides_ok(const int64_t st[3], int seq, int heads, int batch)
{
    const int64_t lim = (int64_t)1 << 38; /* elements: 2^39 bytes */
    for (int i = 0; i < 3; i++)
        if (st[i] < 0 || st[i] % 8 != 0 || st[i] >= lim)
            return 0;
    if ((seq > 1 && st[2] == 0) || (heads > 1 && st[1] == 0) ||
        (batch > 1 && st[0] == 0))
        return 0;
    return 1;
}

int stof__wgmma_strides_ok(const stof_attention_desc *d)
{
    const int kvh = d->heads / stof__kv_group(d);
    return strides_ok(d->q_stride, d->seq_q, d->heads, d->batch) &&
           strides_ok(d->o_stride, d->seq_q, d->heads, d->batch) &&
           strides_ok(d->k_stride, d->seq_k, kvh, d->batch) &&
           strides_ok(d->v_stride, d->seq_k, kvh, d->batch);
}

stof_status stof__wgmma_launch(CUfunction fn, const stof_wgmma_cfg *c,
                               int head_dim, const stof_attention_desc *d,
                               float scale, const stof_block_format *bf,
                               CUdeviceptr row_order, CUdeviceptr q,
                               CUdeviceptr k, CUdeviceptr v, CUdeviceptr o,
                               CUstream s, const stof_api *api)
{
    return stof__wgmma_launch_ex(fn, c, head_dim, d, scale, bf, row_order, q,
                                 k, v, o, NULL, s, api);
}

/* What x asks besides O, into the launch parameters (d: the bias's
 * strides). */
static void set_out(stof_attn_wgmma_params *p, const stof_attention_desc *d,
                    const stof_attn_ext *x)
{
    memcpy(p->bias_stride, d->bias_stride, sizeof(p->bias_stride));
    if (!x)
        return;
    p->lse = x->lse;
    p->o_part = x->o_part;
    p->lse_part = x->lse_part;
    p->n_split = x->n_split;
    p->alibi = x->alibi;
    p->bias = x->bias;
    p->k_lim = x->k_lim;
}

stof_status stof__wgmma_launch_ex(CUfunction fn, const stof_wgmma_cfg *c,
                                  int head_dim, const stof_attention_desc *d,
                                  float scale, const stof_block_format *bf,
                                  CUdeviceptr row_order, CUdeviceptr q,
                                  CUdeviceptr k, CUdeviceptr v, CUdeviceptr o,
                                  const stof_attn_ext *x, CUstream s,
                                  const stof_api *api)
{
    if (!fn || !c || !d || !bf || !api || !api->cuLaunchKernel || c->gather)
        return STOF_ERR_INVALID_ARGUMENT;
    if (!stof__wgmma_cfg_valid(NULL, head_dim, c, NULL, 0))
        return STOF_ERR_INVALID_ARGUMENT;
    if (d->head_dim != head_dim ||
        (d->dtype != STOF_DTYPE_FP16 && d->dtype != STOF_DTYPE_BF16) ||
        bf->block_m != stof__wgmma_format_block_m(c) ||
        bf->block_n != c->block_n || bf->seq_q != d->seq_q ||
        bf->seq_k != d->seq_k ||
        bf->bitmap_words_per_row != c->block_n / 32 || !bf->mem ||
        d->batch < 1 || d->heads < 1 || bf->n_row_blocks < 1 ||
        (int64_t)bf->n_row_blocks * d->batch * d->heads > INT32_MAX ||
        (stof__wgmma_block_m(c) == 192 && row_order))
        return STOF_ERR_INVALID_ARGUMENT;
    if (!q || !k || !v || !o || (q | k | v | o) % 16u || row_order % 4u)
        return STOF_ERR_INVALID_ARGUMENT;
    const unsigned gz = stof__split_grid_z(c->split, x);
    if (!gz || (x && x->lse % 4u) || !stof__mods_match(c->mods, d, x))
        return STOF_ERR_INVALID_ARGUMENT;
    const int kvh = d->heads / stof__kv_group(d);
    if (!strides_ok(d->q_stride, d->seq_q, d->heads, d->batch) ||
        !strides_ok(d->o_stride, d->seq_q, d->heads, d->batch) ||
        !strides_ok(d->k_stride, d->seq_k, kvh, d->batch) ||
        !strides_ok(d->v_stride, d->seq_k, kvh, d->batch))
        return STOF_ERR_INVALID_ARGUMENT;
    if (scale == 0.0f)
        scale = 1.0f / sqrtf((float)head_dim);
    if (!(scale > 0.0f) || isinf(scale))
        return STOF_ERR_INVALID_ARGUMENT;

    stof_encode_tiled_fn enc = stof__encode_tiled(api);
    if (!enc)
        return STOF_ERR_UNSUPPORTED;

    stof_attn_wgmma_params p;
    memset(&p, 0, sizeof(p));
    if (make_map(enc, &p.tm_q, d->dtype, q, head_dim, d->seq_q, d->heads,
                 d->batch, d->q_stride,
                 (unsigned)stof__wgmma_block_m(c)) != CUDA_SUCCESS ||
        make_map(enc, &p.tm_k, d->dtype, k, head_dim, d->seq_k, kvh,
                 d->batch, d->k_stride, (unsigned)c->block_n) != CUDA_SUCCESS ||
        make_map(enc, &p.tm_v, d->dtype, v, head_dim, d->seq_k, kvh,
                 d->batch, d->v_stride, (unsigned)c->block_n) != CUDA_SUCCESS ||
        (!c->split &&
         make_map(enc, &p.tm_o, d->dtype, o, head_dim, d->seq_q, d->heads,
                  d->batch, d->o_stride, 64u) != CUDA_SUCCESS))
        return STOF_ERR_CUDA;
    p.o = o;
    p.row_ptr = bf->row_ptr;
    p.col_idx = bf->col_idx;
    p.kind = bf->kind;
    p.bitmap_idx = bf->bitmap_idx;
    p.bitmaps = bf->bitmaps;
    p.row_order = row_order;
    memcpy(p.o_stride, d->o_stride, sizeof(p.o_stride));
    p.batch = d->batch;
    p.heads = d->heads;
    p.seq_q = d->seq_q;
    p.seq_k = d->seq_k;
    /* (192 rows: the CTAs' row blocks; the kernel finds each one's tiles
     * at the format's row block 3 rb) */
    p.n_row_blocks = stof__wgmma_block_m(c) == 192
                         ? stof__wgmma_row_blocks(c, d->seq_q)
                         : bf->n_row_blocks;
    p.bitmap_words_per_row = bf->bitmap_words_per_row;
    p.scale_log2 = (float)((double)scale * 1.4426950408889634);
    stof__softcap_params(d->softcap, scale, &p.cap_in, &p.cap_out);
    p.rp_stride = bf->rp_stride;
    p.kv_group = stof__kv_group(d);
    set_out(&p, d, x);

    const size_t smem = stof__wgmma_smem_bytes(head_dim, c);
    /* Row blocks times batch * heads: the CTAs (stof_cta_rb_bh), or the
     * persistent kernel's work items. */
    const int64_t items = (int64_t)p.n_row_blocks * d->batch * d->heads;
    if (items > INT32_MAX)
        return STOF_ERR_INVALID_ARGUMENT;
    unsigned gx = (unsigned)items;
    if (c->persist) {
        /* One CTA per SM slot at most, each walking the work items. */
        gx = x && x->ctas > 0 && x->ctas < items ? (unsigned)x->ctas
                                                 : (unsigned)items;
        p.persist_hg = x ? x->persist_heads : 0;
        p.sched = x ? x->sched : 0;
    }
    void *args[] = {&p};
    const stof_launch_opts pdl = {.pdl = 1};
    CUresult r = stof__launch(
        api, fn, gx, 1, gz, 128u + 2u * (unsigned)stof__wgmma_block_m(c),
        (unsigned)smem, s, args, &pdl);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}

stof_status stof__wgmma_gather_launch(CUfunction fn, const stof_wgmma_cfg *c,
                                      int head_dim,
                                      const stof_attention_desc *d,
                                      float scale,
                                      const stof_rowwise_format *rf,
                                      CUdeviceptr row_order,
                                      CUdeviceptr q_rows, CUdeviceptr q,
                                      CUdeviceptr k, CUdeviceptr v,
                                      CUdeviceptr o, CUstream s,
                                      const stof_api *api)
{
    return stof__wgmma_gather_launch_ex(fn, c, head_dim, d, scale, rf,
                                        row_order, q_rows, q, k, v, o, NULL,
                                        s, api);
}

stof_status stof__wgmma_gather_launch_ex(
    CUfunction fn, const stof_wgmma_cfg *c, int head_dim,
    const stof_attention_desc *d, float scale, const stof_rowwise_format *rf,
    CUdeviceptr row_order, CUdeviceptr q_rows, CUdeviceptr q, CUdeviceptr k,
    CUdeviceptr v, CUdeviceptr o, const stof_attn_ext *x, CUstream s,
    const stof_api *api)
{
    if (!fn || !c || !d || !rf || !api || !api->cuLaunchKernel ||
        c->gather != 1)
        return STOF_ERR_INVALID_ARGUMENT;
    if (!stof__wgmma_cfg_valid(NULL, head_dim, c, NULL, 0))
        return STOF_ERR_INVALID_ARGUMENT;
    if (d->head_dim != head_dim ||
        (d->dtype != STOF_DTYPE_FP16 && d->dtype != STOF_DTYPE_BF16) ||
        rf->block_m != stof__wgmma_block_m(c) || rf->block_n != c->block_n ||
        rf->seq_q != d->seq_q || rf->seq_k != d->seq_k ||
        rf->bitmap_words_per_row != c->block_n / 32 || !rf->mem ||
        d->batch < 1 || d->heads < 1 || rf->n_row_blocks < 1 ||
        (int64_t)rf->n_row_blocks * d->batch * d->heads > INT32_MAX)
        return STOF_ERR_INVALID_ARGUMENT;
    if (!q || !k || !v || !o || (q | k | v | o) % 16u || row_order % 4u ||
        q_rows % 4u)
        return STOF_ERR_INVALID_ARGUMENT;
    const unsigned gz = stof__split_grid_z(c->split, x);
    if (!gz || (x && x->lse % 4u) || !stof__mods_match(c->mods, d, x))
        return STOF_ERR_INVALID_ARGUMENT;
    const int kvh = d->heads / stof__kv_group(d);
    if (!strides_ok(d->q_stride, d->seq_q, d->heads, d->batch) ||
        !strides_ok(d->o_stride, d->seq_q, d->heads, d->batch) ||
        !strides_ok(d->k_stride, d->seq_k, kvh, d->batch) ||
        !strides_ok(d->v_stride, d->seq_k, kvh, d->batch))
        return STOF_ERR_INVALID_ARGUMENT;
    /* The kernel keeps key row offsets in 16-byte units in 32 bits. */
    if ((d->k_stride[2] / 8) * (int64_t)(d->seq_k - 1) > (int64_t)UINT32_MAX ||
        (d->v_stride[2] / 8) * (int64_t)(d->seq_k - 1) > (int64_t)UINT32_MAX)
        return STOF_ERR_INVALID_ARGUMENT;
    if (scale == 0.0f)
        scale = 1.0f / sqrtf((float)head_dim);
    if (!(scale > 0.0f) || isinf(scale))
        return STOF_ERR_INVALID_ARGUMENT;

    stof_attn_wgmma_params p;
    memset(&p, 0, sizeof(p));
    p.o = o;
    p.row_ptr = rf->tile_ptr;
    p.col_idx = 0; /* unused in gather mode */
    p.kind = rf->kind;
    p.bitmap_idx = rf->bitmap_idx;
    p.bitmaps = rf->bitmaps;
    p.row_order = row_order;
    memcpy(p.o_stride, d->o_stride, sizeof(p.o_stride));
    p.batch = d->batch;
    p.heads = d->heads;
    p.seq_q = d->seq_q;
    p.seq_k = d->seq_k;
    p.n_row_blocks = rf->n_row_blocks;
    p.bitmap_words_per_row = rf->bitmap_words_per_row;
    p.scale_log2 = (float)((double)scale * 1.4426950408889634);
    stof__softcap_params(d->softcap, scale, &p.cap_in, &p.cap_out);
    p.rp_stride = 0;
    p.kv_group = stof__kv_group(d);
    set_out(&p, d, x);
    p.q = q;
    p.k = k;
    p.v = v;
    p.key_ptr = rf->key_ptr;
    p.keys = rf->keys;
    p.q_rows = q_rows;
    memcpy(p.q_stride, d->q_stride, sizeof(p.q_stride));
    memcpy(p.k_stride, d->k_stride, sizeof(p.k_stride));
    memcpy(p.v_stride, d->v_stride, sizeof(p.v_stride));

    const size_t smem = stof__wgmma_smem_bytes(head_dim, c);
    void *args[] = {&p};
    const stof_launch_opts pdl = {.pdl = 1};
    CUresult r = stof__launch(
        api, fn, (unsigned)(rf->n_row_blocks * d->batch * d->heads), 1, gz,
        128u + 2u * (unsigned)stof__wgmma_block_m(c), (unsigned)smem, s, args,
        &pdl);
    return r == CUDA_SUCCESS ? STOF_OK : STOF_ERR_CUDA;
}

/* ------------------------------------------------------------------------ */
/* Heavy-first row order                                                     */
/* ------------------------------------------------------------------------ */

typedef struct row_work {
    int64_t w; /* 4 per full tile, 5 per partial one */
    int32_t i;
} row_work;

static int cmp_work(const void *a, const void *b)
{
    const row_work *x = a, *y = b;
    if (x->w != y->w)
        return x->w < y->w ? 1 : -1;
    return (x->i > y->i) - (x->i < y->i);
}

int stof__wgmma_format_persist_heads(const stof_device *dev,
                                     const stof_attention_desc *d,
                                     const stof_wgmma_cfg *c,
                                     const stof_format *f)
{
    if (!f || f->n_row_blocks < 1 || !f->row_ptr || !f->kind)
        return 0;
    /* 192-row CTAs: one item per three of the format's row blocks, its
     * work three times the first's (the three list the same tiles). */
    const int fold = stof__wgmma_block_m(c) == 192 ? 3 : 1;
    const int nb = (f->n_row_blocks + fold - 1) / fold;
    double *w = malloc(sizeof(double) * (size_t)nb);
    if (!w)
        return 0;
    for (int i = 0; i < nb; i++) {
        int64_t t = 0; /* as stof__wgmma_row_order weighs them */
        for (int64_t e = f->row_ptr[fold * i]; e < f->row_ptr[fold * i + 1];
             e++)
            t += f->kind[e] == STOF_TILE_PARTIAL ? 5 : 4;
        w[i] = (double)(t * fold);
    }
    const int sched = stof__wgmma_persist_heads(
        dev, d, w, nb, stof__wgmma_persist_ctas(dev, d->head_dim, c));
    free(w);
    return sched;
}

int32_t *stof__wgmma_format_persist_list(const stof_device *dev,
                                         const stof_attention_desc *d,
                                         const stof_wgmma_cfg *c,
                                         const stof_format *f, size_t *n)
{
    *n = 0;
    if (!f || f->n_row_blocks < 1 || !f->row_ptr || !f->kind ||
        stof__wgmma_block_m(c) == 192)
        return NULL;
    const int nrb = f->n_row_blocks;
    double *w = malloc(sizeof(double) * (size_t)nrb);
    if (!w)
        return NULL;
    double mean = 0.0;
    for (int i = 0; i < nrb; i++) {
        int64_t t = 0; /* as stof__wgmma_row_order weighs them */
        for (int64_t e = f->row_ptr[i]; e < f->row_ptr[i + 1]; e++)
            t += f->kind[e] == STOF_TILE_PARTIAL ? 5 : 4;
        w[i] = (double)t;
        mean += w[i];
    }
    mean /= nrb;
    /* rank r is the r-th heaviest row block (the row order) */
    qsort(w, (size_t)nrb, sizeof(double), cmp_double_desc);
    /* An item's fixed cost: about half a mean row block's work (as
     * stof__wgmma_persist_heads). */
    /* As many slots as the launch has CTAs: the persistent CTAs, or one
     * per item when there are fewer (stof__wgmma_launch_ex). */
    const int64_t bh = (int64_t)d->batch * d->heads, items = nrb * bh;
    const int ctas = stof__wgmma_persist_ctas(dev, d->head_dim, c);
    int32_t *l = stof__wgmma_persist_list(
        w, nrb, bh, stof__wgmma_persist_group(dev, d),
        ctas < items ? ctas : (int)items, mean / 2, n);
    free(w);
    return l;
}

void stof__wgmma_row_order(const stof_format *f, int32_t *order)
{
    if (!f || !order || f->n_row_blocks < 1)
        return;
    const int nb = f->n_row_blocks;
    row_work *rw = malloc((size_t)nb * sizeof(*rw));
    if (!rw) {
        for (int i = 0; i < nb; i++)
            order[i] = i;
        return;
    }
    for (int i = 0; i < nb; i++) {
        int64_t w = 0;
        for (int64_t e = f->row_ptr[i]; e < f->row_ptr[i + 1]; e++)
            w += f->kind[e] == STOF_TILE_PARTIAL ? 5 : 4;
        rw[i].w = w;
        rw[i].i = i;
    }
    qsort(rw, (size_t)nb, sizeof(*rw), cmp_work);
    for (int i = 0; i < nb; i++)
        order[i] = rw[i].i;
    free(rw);
}

void stof__wgmma_gather_row_order(const stof_format *f, int32_t *order)
{
    if (!f || !order || f->n_row_blocks < 1)
        return;
    const int nb = f->n_row_blocks;
    row_work *rw = f->rw_ptr ? malloc((size_t)nb * sizeof(*rw)) : NULL;
    if (!rw) {
        for (int i = 0; i < nb; i++)
            order[i] = i;
        return;
    }
    for (int i = 0; i < nb; i++) {
        rw[i].w = f->rw_ptr[i + 1] - f->rw_ptr[i];
        rw[i].i = i;
    }
    qsort(rw, (size_t)nb, sizeof(*rw), cmp_work);
    for (int i = 0; i < nb; i++)
        order[i] = rw[i].i;
    free(rw);
}
