/*
 * spec_eval.c - evaluating a parsed spec (spec.h) for one instance: words
 * of a row (a window of 64-bit words, or the whole row), and the class of
 * a rectangle from the structure alone. stof_mask_from_spec fills a bit
 * matrix row by row with it; family.c builds formats tile by tile.
 *
 * Every leaf writes its window with interval fills, periodic word patterns
 * or per-row caches, and inner nodes combine windows with word-wise
 * AND/OR/NOT. The cost per row is about the words of the window times the
 * number of leaves (plus the set bits for sparse random masks), never one
 * predicate call per element.
 */
#include "spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef stof_spec_node node;

/* Per-leaf evaluation state. */
typedef struct leaf_state {
    uint64_t *pat;      /* strided: the periodic row; dilated: word table */
    uint64_t *row;      /* bigbird/random: the cached row */
    uint64_t *seen;     /* bigbird: scratch bitset over column blocks */
    int64_t cached;     /* bigbird: block row; random: position; -1 none */
    int64_t doc_pos;    /* docs: the position of the cached interval */
    int64_t doc_lo, doc_hi;
} leaf_state;

struct stof_spec_eval {
    const stof_spec *spec;
    int64_t seq_q, seq_k;
    int64_t wpr;          /* words per row */
    uint64_t last_mask;   /* valid bits of the last word of a row */
    stof_spec_inst inst;
    leaf_state *st;       /* n_leaves */
    uint64_t *tmp;        /* height windows of wpr words */
};

/* The window being written: words w0 .. w0+nw-1 of a row. */
typedef struct win {
    int64_t w0;
    int nw;
} win;

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A well-mixed 64-bit value of x (the splitmix64 finaliser). */
static uint64_t mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The SEED of a leaf for this instance: unchanged without instance seed. */
static uint64_t leaf_seed(const stof_spec_eval *e, uint64_t seed)
{
    return e->inst.seed ? seed ^ mix64(e->inst.seed ^ 0x5851f42d4c957f2dull)
                        : seed;
}

/* Clip keys [*lo, *hi) to [0, seq_k) and the window; 0 when nothing is
 * left. */
static int clip_keys(int64_t *lo, int64_t *hi, const win *w,
                     const stof_spec_eval *e)
{
    int64_t base = 64 * w->w0, end = base + 64 * (int64_t)w->nw;
    if (end > e->seq_k)
        end = e->seq_k;
    if (*lo < base)
        *lo = base;
    if (*hi > end)
        *hi = end;
    return *lo < *hi;
}

/* Set keys [lo, hi) in the window; clipped to [0, seq_k) and the window. */
static void set_range(uint64_t *out, int64_t lo, int64_t hi, const win *w,
                      const stof_spec_eval *e)
{
    if (!clip_keys(&lo, &hi, w, e))
        return;
    const int64_t base = 64 * w->w0;
    lo -= base;
    hi -= base;
    int64_t wlo = lo >> 6, whi = (hi - 1) >> 6;
    uint64_t mlo = ~0ull << (lo & 63);
    uint64_t mhi = ~0ull >> (63 - ((hi - 1) & 63));
    if (wlo == whi) {
        out[wlo] |= mlo & mhi;
        return;
    }
    out[wlo] |= mlo;
    for (int64_t i = wlo + 1; i < whi; i++)
        out[i] = ~0ull;
    out[whi] |= mhi;
}

static void set_full(uint64_t *out, const win *w, const stof_spec_eval *e)
{
    set_range(out, 64 * w->w0, 64 * (w->w0 + w->nw), w, e);
}

/* Clear the bits at or past seq_k of a window. */
static void clip(uint64_t *out, const win *w, const stof_spec_eval *e)
{
    if (w->w0 + w->nw == e->wpr)
        out[w->nw - 1] &= e->last_mask;
}

/* ------------------------------------------------------------------------ */
/* Leaf state                                                                */
/* ------------------------------------------------------------------------ */

static int leaf_prepare(const node *n, leaf_state *ls, const stof_spec_eval *e)
{
    ls->cached = -1;
    ls->doc_pos = -1;
    switch (n->kind) {
    case STOF_LEAF_STRIDED: {
        /* Columns with k % S == S-1, the same in every row. */
        ls->pat = calloc((size_t)e->wpr, sizeof(uint64_t));
        if (!ls->pat)
            return -1;
        int64_t s = (int64_t)n->v[0];
        for (int64_t k = s - 1; k < e->seq_k; k += s)
            ls->pat[k >> 6] |= 1ull << (k & 63);
        return 0;
    }
    case STOF_LEAF_DILATED: {
        /* For D <= 64, pat[r] holds the bits b of a word with
         * (r + b) % D == 0: word w of position p is pat[(64w - p) mod D]. */
        int64_t d = (int64_t)n->v[1];
        if (d > 64)
            return 0;
        ls->pat = calloc((size_t)d, sizeof(uint64_t));
        if (!ls->pat)
            return -1;
        for (int64_t r = 0; r < d; r++)
            for (int64_t b = (d - r % d) % d; b < 64; b += d)
                ls->pat[r] |= 1ull << b;
        return 0;
    }
    case STOF_LEAF_BIGBIRD: {
        int64_t b = (int64_t)n->v[0];
        int64_t nbk = (e->seq_k + b - 1) / b;
        ls->row = malloc((size_t)e->wpr * sizeof(uint64_t));
        ls->seen = calloc((size_t)((nbk + 63) / 64), sizeof(uint64_t));
        return ls->row && ls->seen ? 0 : -1;
    }
    case STOF_LEAF_RANDOM:
        ls->row = malloc((size_t)e->wpr * sizeof(uint64_t));
        return ls->row ? 0 : -1;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------------ */
/* Rows of the leaves                                                        */
/* ------------------------------------------------------------------------ */

/* Keys k with |p-k| < W and (p-k) % D == 0, p the query's position. */
static void dilated_words(const node *n, const leaf_state *ls, int64_t p,
                          uint64_t *out, const win *wn,
                          const stof_spec_eval *e)
{
    int64_t w = (int64_t)n->v[0], d = (int64_t)n->v[1];
    int64_t lo = p - w + 1, hi = p + w;
    const int64_t base = 64 * wn->w0;
    if (!clip_keys(&lo, &hi, wn, e))
        return;
    if (d == 1) {
        set_range(out, lo, hi, wn, e);
        return;
    }
    if (!ls->pat) {
        /* D > 64: at most one bit per word, set them one by one. */
        int64_t k = lo + (((p - lo) % d) + d) % d;
        for (; k < hi; k += d)
            out[(k - base) >> 6] |= 1ull << (k & 63);
        return;
    }
    int64_t wlo = lo >> 6, whi = (hi - 1) >> 6;
    int64_t r = ((64 * wlo - p) % d + d) % d;
    int64_t step = 64 % d;
    for (int64_t wi = wlo; wi <= whi; wi++) {
        uint64_t m = ls->pat[r];
        if (wi == wlo)
            m &= ~0ull << (lo & 63);
        if (wi == whi)
            m &= ~0ull >> (63 - ((hi - 1) & 63));
        out[wi - wn->w0] = m;
        r += step;
        if (r >= d)
            r -= d;
    }
}

/* The row shared by every position of bigbird block row i (see stof.h). */
static void bigbird_block_row(const node *n, leaf_state *ls, int64_t i,
                              const stof_spec_eval *e)
{
    int64_t b = (int64_t)n->v[0], w = (int64_t)n->v[1], g = (int64_t)n->v[2];
    int64_t r = (int64_t)n->v[3];
    uint64_t seed = leaf_seed(e, n->v[4]);
    int64_t nbk = (e->seq_k + b - 1) / b;
    uint64_t *row = ls->row;
    const win all = {0, (int)e->wpr};
    memset(row, 0, (size_t)e->wpr * sizeof(uint64_t));
    if (i < g || r >= nbk) {
        set_full(row, &all, e);
        return;
    }
    set_range(row, 0, g * b, &all, e);
    int64_t jlo = i - (w - 1) / 2, jhi = i + w / 2;
    if (jlo < 0)
        jlo = 0;
    if (jhi > nbk - 1)
        jhi = nbk - 1;
    if (jlo <= jhi)
        set_range(row, jlo * b, (jhi + 1) * b, &all, e);
    if (r == 0)
        return;
    /* R distinct block columns by Floyd's algorithm, from a generator that
     * depends only on SEED and i. */
    uint64_t s = seed ^ mix64((uint64_t)i + 0x632be59bd9b4e019ull);
    for (int64_t j = nbk - r; j < nbk; j++) {
        int64_t t = (int64_t)(splitmix64(&s) % (uint64_t)(j + 1));
        if (ls->seen[t >> 6] & (1ull << (t & 63)))
            t = j;
        ls->seen[t >> 6] |= 1ull << (t & 63);
        set_range(row, t * b, (t + 1) * b, &all, e);
    }
    /* Clear only the words touched, so the cost stays O(R). */
    s = seed ^ mix64((uint64_t)i + 0x632be59bd9b4e019ull);
    for (int64_t j = nbk - r; j < nbk; j++) {
        int64_t t = (int64_t)(splitmix64(&s) % (uint64_t)(j + 1));
        ls->seen[t >> 6] = 0;
        ls->seen[j >> 6] = 0;
    }
}

/* OR into row the elements of a Bernoulli(p) row, found by skipping
 * geometric gaps: the cost is one draw per kept element. */
static void random_sparse(double p, uint64_t *s, uint64_t *row,
                          const stof_spec_eval *e)
{
    const double inv = 1.0 / log1p(-p);
    double k = -1.0;
    for (;;) {
        /* u in (0, 1]; gap = failures before the next success. */
        double u = ((double)(splitmix64(s) >> 11) + 1.0) *
                   (1.0 / 9007199254740992.0);
        k += floor(log(u) * inv) + 1.0;
        if (k >= (double)e->seq_k)
            break;
        int64_t ki = (int64_t)k;
        row[ki >> 6] |= 1ull << (ki & 63);
    }
}

/* The whole row of position p: each element kept with probability P, from
 * a generator seeded by SEED and p (so a row does not depend on the
 * others). For P > 1/2 the complement is drawn with 1 - P. Then
 * P = a + (1 - a) r with a = P rounded down to 10 binary digits: whole
 * words with bit probability a come from one random word per binary digit
 * of a (an AND/OR cascade), and the remainder r < 1/512 is ORed in by
 * geometric skipping. Tiny P uses the skipping alone. The result is exactly
 * Bernoulli(P) per element, and key k's bit does not depend on seq_k (each
 * word's cascade draws and the skipping walk are prefixes of their
 * streams). */
static void random_row(const node *n, int64_t p, uint64_t *row,
                       const stof_spec_eval *e)
{
    const win all = {0, (int)e->wpr};
    double pr = n->prob;
    memset(row, 0, (size_t)e->wpr * sizeof(uint64_t));
    if (pr <= 0.0)
        return;
    if (pr >= 1.0) {
        set_full(row, &all, e);
        return;
    }
    const int invert = pr > 0.5;
    if (invert)
        pr = 1.0 - pr;
    uint64_t s = mix64(leaf_seed(e, n->v[1]) ^
                       mix64((uint64_t)p + 0x2545f4914f6cdd1dull));
    double r = pr;
    if (pr >= 1.0 / 256.0) {
        const unsigned a10 = (unsigned)(pr * 1024.0); /* 4..512 */
        const double a = (double)a10 / 1024.0;
        r = (pr - a) / (1.0 - a);
        const int first = __builtin_ctz(a10);
        for (int64_t w = 0; w < e->wpr; w++) {
            uint64_t x = 0;
            for (int b = first; b < 10; b++) {
                uint64_t y = splitmix64(&s);
                x = ((a10 >> b) & 1u) ? (x | y) : (x & y);
            }
            row[w] = x;
        }
    }
    if (r > 0.0) {
        /* The remainder from a stream of its own: after the cascade's
         * draws (one set a word) the same stream would make key k's bit
         * depend on how many words the row has, i.e. on seq_k or k_len. */
        uint64_t s2 = mix64(leaf_seed(e, n->v[1]) ^
                            mix64((uint64_t)p + 0x9e6c63d0676a9a99ull));
        random_sparse(r, &s2, row, e);
    }
    if (invert)
        for (int64_t w = 0; w < e->wpr; w++)
            row[w] = ~row[w];
    row[e->wpr - 1] &= e->last_mask;
}

/* The window of row q of the instance's bitmap (32-bit words, two to a
 * 64-bit word; NULL: every key). */
static void bitmap_words(int64_t q, uint64_t *out, const win *w,
                         const stof_spec_eval *e)
{
    if (!e->inst.bitmap) {
        set_full(out, w, e);
        return;
    }
    if (q < 0 || q >= e->seq_q)
        return;
    const uint32_t *row = e->inst.bitmap + q * e->inst.bitmap_words;
    const int64_t n32 = (e->seq_k + 31) / 32;
    for (int i = 0; i < w->nw; i++) {
        const int64_t j = 2 * (w->w0 + i);
        uint64_t x = j < n32 ? row[j] : 0;
        if (j + 1 < n32)
            x |= (uint64_t)row[j + 1] << 32;
        out[i] = x;
    }
    clip(out, w, e);
}

/* The document interval [lo, hi) of position p (empty past the keys). */
static void doc_interval(leaf_state *ls, int64_t p, const stof_spec_eval *e,
                         int64_t *lo, int64_t *hi)
{
    if (ls->doc_pos == p) {
        *lo = ls->doc_lo;
        *hi = ls->doc_hi;
        return;
    }
    const int32_t *doc = e->inst.doc;
    int64_t a = 0, b = 0;
    if (p < 0 || p >= e->seq_k) {
        a = b = 0;
    } else if (!doc) {
        a = 0;
        b = e->seq_k;
    } else {
        const int32_t id = doc[p];
        /* First position with doc >= id, first with doc > id (sorted). */
        int64_t l = 0, h = p;
        while (l < h) {
            int64_t m = l + (h - l) / 2;
            if (doc[m] < id)
                l = m + 1;
            else
                h = m;
        }
        a = l;
        l = p + 1;
        h = e->seq_k;
        while (l < h) {
            int64_t m = l + (h - l) / 2;
            if (doc[m] <= id)
                l = m + 1;
            else
                h = m;
        }
        b = l;
    }
    ls->doc_pos = p;
    ls->doc_lo = *lo = a;
    ls->doc_hi = *hi = b;
}

/* Write the window of position p's row of a leaf (every word is written). */
static void leaf_words(const node *n, leaf_state *ls, int64_t p,
                       uint64_t *out, const win *w, stof_spec_eval *e)
{
    int64_t v0 = (int64_t)n->v[0];
    const size_t bytes = (size_t)w->nw * sizeof(uint64_t);
    switch (n->kind) {
    case STOF_LEAF_STRIDED:
        memcpy(out, ls->pat + w->w0, bytes);
        set_range(out, p - v0 + 1, p + v0, w, e);
        return;
    case STOF_LEAF_BIGBIRD: {
        int64_t i = p / v0;
        if (ls->cached != i) {
            bigbird_block_row(n, ls, i, e);
            ls->cached = i;
        }
        memcpy(out, ls->row + w->w0, bytes);
        return;
    }
    case STOF_LEAF_RANDOM:
        if (ls->cached != p) {
            random_row(n, p, ls->row, e);
            ls->cached = p;
        }
        memcpy(out, ls->row + w->w0, bytes);
        return;
    default:
        break;
    }
    memset(out, 0, bytes);
    switch (n->kind) {
    case STOF_LEAF_DENSE:
        set_full(out, w, e);
        break;
    case STOF_LEAF_NONE:
        break;
    case STOF_LEAF_CAUSAL:
        set_range(out, 0, p + 1, w, e);
        break;
    case STOF_LEAF_SLIDING:
        set_range(out, p - v0 + 1, p + v0, w, e);
        break;
    case STOF_LEAF_CAUSAL_SLIDING:
        set_range(out, p - v0 + 1, p + 1, w, e);
        break;
    case STOF_LEAF_DILATED:
        dilated_words(n, ls, p, out, w, e);
        break;
    case STOF_LEAF_LONGFORMER:
        if (p < (int64_t)n->v[1]) {
            set_full(out, w, e);
        } else {
            set_range(out, p - v0 + 1, p + v0, w, e);
            set_range(out, 0, (int64_t)n->v[1], w, e);
        }
        break;
    case STOF_LEAF_DOCS: {
        int64_t lo, hi;
        doc_interval(ls, p, e, &lo, &hi);
        set_range(out, lo, hi, w, e);
        break;
    }
    case STOF_LEAF_PREFIX:
        set_range(out, 0, n->n_params ? v0 : e->inst.prefix, w, e);
        break;
    case STOF_LEAF_BITMAP:
        bitmap_words(p - e->inst.q_offset, out, w, e);
        break;
    case STOF_LEAF_HEAD_SLIDING:
        if (!e->inst.has_window)
            set_full(out, w, e);
        else
            set_range(out, p - e->inst.window + 1, p + e->inst.window, w, e);
        break;
    case STOF_LEAF_HEAD_CAUSAL_SLIDING:
        set_range(out, e->inst.has_window ? p - e->inst.window + 1 : 0, p + 1,
                  w, e);
        break;
    case STOF_LEAF_STRIDED:
    case STOF_LEAF_BIGBIRD:
    case STOF_LEAF_RANDOM:
        break; /* handled above */
    }
}

/* Write the window of position p's row of the subtree n into out;
 * tmp + level * wpr onwards is scratch. */
static void eval_node(stof_spec_eval *e, const node *n, int64_t p,
                      uint64_t *out, int level, const win *w)
{
    if (n->op == STOF_SPEC_LEAF) {
        leaf_words(n, &e->st[n->leaf_id], p, out, w, e);
        return;
    }
    eval_node(e, n->kids[0], p, out, level + 1, w);
    if (n->op == STOF_SPEC_NOT) {
        for (int i = 0; i < w->nw; i++)
            out[i] = ~out[i];
        clip(out, w, e);
        return;
    }
    uint64_t *t = e->tmp + (size_t)level * (size_t)e->wpr;
    for (int k = 1; k < n->n_kids; k++) {
        eval_node(e, n->kids[k], p, t, level + 1, w);
        if (n->op == STOF_SPEC_AND)
            for (int i = 0; i < w->nw; i++)
                out[i] &= t[i];
        else
            for (int i = 0; i < w->nw; i++)
                out[i] |= t[i];
    }
}

void stof__spec_eval_words(stof_spec_eval *e, int64_t q, int64_t w0, int nw,
                           uint64_t *out)
{
    const win w = {w0, nw};
    eval_node(e, e->spec->root, q + e->inst.q_offset, out, 0, &w);
}

/* ------------------------------------------------------------------------ */
/* Classification                                                            */
/* ------------------------------------------------------------------------ */

#define C_EMPTY STOF_TILE_EMPTY
#define C_FULL STOF_TILE_FULL
#define C_MAYBE (-1)

/* The band |p - k| < W (lo = -W+1 .. hi = W-1 of d = p - k), with d over
 * [dmin, dmax]: all inside, all outside, or some. */
static int band(int64_t dmin, int64_t dmax, int64_t lo, int64_t hi)
{
    if (dmin >= lo && dmax <= hi)
        return C_FULL;
    if (dmax < lo || dmin > hi)
        return C_EMPTY;
    return C_MAYBE;
}

/* Keys k0..k1 all below x, none below x, or some. */
static int below(int64_t k0, int64_t k1, int64_t x)
{
    return k1 < x ? C_FULL : (k0 >= x ? C_EMPTY : C_MAYBE);
}

static int leaf_classify(stof_spec_eval *e, const node *n, int64_t p0,
                         int64_t p1, int64_t k0, int64_t k1)
{
    const int64_t v0 = (int64_t)n->v[0];
    const int64_t dmin = p0 - k1, dmax = p1 - k0;
    switch (n->kind) {
    case STOF_LEAF_DENSE:
        return C_FULL;
    case STOF_LEAF_NONE:
        return C_EMPTY;
    case STOF_LEAF_CAUSAL:
        return band(dmin, dmax, 0, INT64_MAX);
    case STOF_LEAF_SLIDING:
        return band(dmin, dmax, -v0 + 1, v0 - 1);
    case STOF_LEAF_CAUSAL_SLIDING:
        return band(dmin, dmax, 0, v0 - 1);
    case STOF_LEAF_DILATED: {
        int c = band(dmin, dmax, -v0 + 1, v0 - 1);
        return (c == C_EMPTY || n->v[1] == 1) ? c : C_MAYBE;
    }
    case STOF_LEAF_LONGFORMER: {
        const int64_t g = (int64_t)n->v[1];
        if (p1 < g || k1 < g)
            return C_FULL;
        int c = band(dmin, dmax, -v0 + 1, v0 - 1);
        if (c == C_FULL)
            return C_FULL;
        if (c == C_EMPTY && p0 >= g && k0 >= g)
            return C_EMPTY;
        return C_MAYBE;
    }
    case STOF_LEAF_STRIDED: {
        int c = band(dmin, dmax, -v0 + 1, v0 - 1);
        if (c != C_EMPTY)
            return c;
        /* The first key with k % S == S-1 at or after k0. */
        int64_t first = k0 + ((v0 - 1 - k0 % v0) + v0) % v0;
        return first > k1 ? C_EMPTY : C_MAYBE;
    }
    case STOF_LEAF_RANDOM:
        return n->prob <= 0.0 ? C_EMPTY : (n->prob >= 1.0 ? C_FULL : C_MAYBE);
    case STOF_LEAF_BIGBIRD:
        return C_MAYBE;
    case STOF_LEAF_PREFIX:
        return below(k0, k1, n->n_params ? v0 : e->inst.prefix);
    case STOF_LEAF_BITMAP:
        return e->inst.bitmap ? C_MAYBE : C_FULL;
    case STOF_LEAF_HEAD_SLIDING: {
        const int64_t hw = e->inst.window;
        return !e->inst.has_window ? C_FULL : band(dmin, dmax, -hw + 1, hw - 1);
    }
    case STOF_LEAF_HEAD_CAUSAL_SLIDING:
        return band(dmin, dmax, 0,
                    e->inst.has_window ? e->inst.window - 1 : INT64_MAX);
    case STOF_LEAF_DOCS: {
        if (p0 >= e->seq_k)
            return C_EMPTY;
        if (!e->inst.doc)
            return p1 < e->seq_k ? C_FULL : C_MAYBE;
        const int32_t *doc = e->inst.doc;
        const int64_t pl = p1 < e->seq_k ? p1 : e->seq_k - 1;
        /* Sorted ids: the rows' documents span doc[p0]..doc[pl], the
         * keys' doc[k0]..doc[k1]. */
        if (doc[pl] < doc[k0] || doc[k1] < doc[p0])
            return C_EMPTY;
        if (p1 < e->seq_k && doc[p0] == doc[pl] && doc[k0] == doc[k1] &&
            doc[p0] == doc[k0])
            return C_FULL;
        return C_MAYBE;
    }
    }
    return C_MAYBE;
}

static int classify(stof_spec_eval *e, const node *n, int64_t p0, int64_t p1,
                    int64_t k0, int64_t k1)
{
    switch (n->op) {
    case STOF_SPEC_LEAF:
        return leaf_classify(e, n, p0, p1, k0, k1);
    case STOF_SPEC_NOT: {
        int c = classify(e, n->kids[0], p0, p1, k0, k1);
        return c == C_FULL ? C_EMPTY : (c == C_EMPTY ? C_FULL : C_MAYBE);
    }
    case STOF_SPEC_AND: {
        int all = 1;
        for (int i = 0; i < n->n_kids; i++) {
            int c = classify(e, n->kids[i], p0, p1, k0, k1);
            if (c == C_EMPTY)
                return C_EMPTY;
            all &= c == C_FULL;
        }
        return all ? C_FULL : C_MAYBE;
    }
    case STOF_SPEC_OR: {
        int none = 1;
        for (int i = 0; i < n->n_kids; i++) {
            int c = classify(e, n->kids[i], p0, p1, k0, k1);
            if (c == C_FULL)
                return C_FULL;
            none &= c == C_EMPTY;
        }
        return none ? C_EMPTY : C_MAYBE;
    }
    }
    return C_MAYBE;
}

int stof__spec_eval_classify(stof_spec_eval *e, int64_t q0, int64_t q1,
                             int64_t k0, int64_t k1)
{
    const int64_t off = e->inst.q_offset;
    return classify(e, e->spec->root, q0 + off, q1 + off, k0, k1);
}

/* ------------------------------------------------------------------------ */
/* The evaluator                                                             */
/* ------------------------------------------------------------------------ */

void stof__spec_eval_free(stof_spec_eval **pe)
{
    if (!pe || !*pe)
        return;
    stof_spec_eval *e = *pe;
    if (e->st) {
        for (int i = 0; i < e->spec->n_leaves; i++) {
            free(e->st[i].pat);
            free(e->st[i].row);
            free(e->st[i].seen);
        }
    }
    free(e->st);
    free(e->tmp);
    free(e);
    *pe = NULL;
}

static int prepare_all(stof_spec_eval *e, const node *n)
{
    if (n->op == STOF_SPEC_LEAF)
        return leaf_prepare(n, &e->st[n->leaf_id], e);
    for (int i = 0; i < n->n_kids; i++)
        if (prepare_all(e, n->kids[i]) != 0)
            return -1;
    return 0;
}

stof_status stof__spec_eval_new(stof_context *ctx, const stof_spec *s,
                                int64_t seq_q, int64_t seq_k,
                                const stof_spec_inst *inst,
                                stof_spec_eval **out)
{
    *out = NULL;
    stof_spec_eval *e = calloc(1, sizeof(*e));
    if (!e)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory evaluating a mask spec");
    e->spec = s;
    e->seq_q = seq_q;
    e->seq_k = seq_k;
    e->wpr = seq_k > 0 ? (seq_k + 63) / 64 : 1;
    e->last_mask = (seq_k % 64) ? (~0ull >> (64 - seq_k % 64)) : ~0ull;
    if (inst)
        e->inst = *inst;
    e->st = calloc((size_t)s->n_leaves, sizeof(leaf_state));
    e->tmp = malloc(((size_t)s->height + 1) * (size_t)e->wpr *
                    sizeof(uint64_t));
    if (!e->st || !e->tmp || prepare_all(e, s->root) != 0) {
        stof__spec_eval_free(&e);
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory evaluating a mask spec for %lld x "
                          "%lld",
                          (long long)seq_q, (long long)seq_k);
    }
    *out = e;
    return STOF_OK;
}

/* ------------------------------------------------------------------------ */
/* stof_mask_from_spec                                                       */
/* ------------------------------------------------------------------------ */

stof_status stof_mask_from_spec(stof_context *ctx, const char *spec, int seq_q,
                                int seq_k, stof_mask **mask)
{
    STOF_CHECK_ARG(ctx, mask != NULL, "stof_mask_from_spec: mask is NULL");
    *mask = NULL;
    STOF_CHECK_ARG(ctx, spec != NULL, "stof_mask_from_spec: spec is NULL");
    STOF_CHECK_ARG(ctx, seq_q >= 1 && seq_q <= STOF_SPEC_MAX_SEQ,
                   "stof_mask_from_spec: seq_q = %d, expected 1..%d", seq_q,
                   STOF_SPEC_MAX_SEQ);
    STOF_CHECK_ARG(ctx, seq_k >= 1 && seq_k <= STOF_SPEC_MAX_SEQ,
                   "stof_mask_from_spec: seq_k = %d, expected 1..%d", seq_k,
                   STOF_SPEC_MAX_SEQ);

    stof_spec *s = NULL;
    stof_status st = stof__spec_parse(ctx, spec, &s);
    if (st != STOF_OK)
        return st;
    stof_mask *m = NULL;
    stof_spec_eval *e = NULL;
    st = stof__mask_alloc(ctx, seq_q, seq_k, &m);
    if (st == STOF_OK)
        st = stof__spec_eval_new(ctx, s, seq_q, seq_k, NULL, &e);
    if (st == STOF_OK) {
        for (int64_t q = 0; q < seq_q; q++)
            stof__spec_eval_words(e, q, 0, m->words_per_row,
                                  m->bits + q * m->words_per_row);
        stof__mask_recount(m);
        /* The spec is kept so that tuning records can be rebuilt from it
         * (stof-tune verify / pending); a long one is not kept. */
        if (strlen(spec) < STOF_MASK_SPEC_MAX && !(m->spec = strdup(spec)))
            st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                            "out of memory evaluating mask spec \"%.100s\"",
                            spec);
    }
    stof__spec_eval_free(&e);
    stof__spec_free(&s);
    if (st != STOF_OK) {
        stof_mask_free(&m);
        return st;
    }
    *mask = m;
    return stof__ok(ctx);
}
