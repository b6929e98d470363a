// mask_eval.cuh - a mask family's elements and tile classes evaluated on
// the GPU from its program and a sequence's instance data: what the format
// builder (mask_build.cu) and the family reference kernel
// (attn_reference.cu) share. The program, the instance data and the
// parameters are described in mask_build.cu.
#ifndef STOF_MASK_EVAL_CUH
#define STOF_MASK_EVAL_CUH
#include "stof_common.cuh"

// Leaf kinds: the host passes its own values (enum stof_leaf_kind).
#ifndef MB_LEAF_DENSE
#define MB_LEAF_DENSE 0
#define MB_LEAF_NONE 1
#define MB_LEAF_CAUSAL 2
#define MB_LEAF_SLIDING 3
#define MB_LEAF_CAUSAL_SLIDING 4
#define MB_LEAF_DILATED 5
#define MB_LEAF_LONGFORMER 6
#define MB_LEAF_BIGBIRD 7
#define MB_LEAF_STRIDED 8
#define MB_LEAF_DOCS 10
#define MB_LEAF_PREFIX 11
#define MB_LEAF_BITMAP 12
#define MB_LEAF_HEAD_SLIDING 13
#define MB_LEAF_HEAD_CAUSAL_SLIDING 14
#endif

#define MB_OP_LEAF 0
#define MB_OP_AND 1
#define MB_OP_OR 2
#define MB_OP_NOT 3
#define MB_OP_PARAM 4 // a leaf's further parameters (bigbird: two nodes)
#define MB_MAX_RANDOM 64
#define MB_MAX_STACK 32
#define MB_THREADS 256
#define MB_MAX_TILE_WORDS 2048 // block_m * ceil(block_n / 32), at most

#define MB_EMPTY 0
#define MB_PARTIAL 1
#define MB_FULL 2
#define MB_UNKNOWN 3

// Must match stof_mb_params in src/kernels/mask_build.c (272 bytes).
struct stof_mb_params {
    const int *prog;
    int n_prog;
    int batch, seq_q, seq_k;
    int block_m, block_n, n_rb, n_cb, bwpr;
    const int *q_len;     // NULL: seq_q
    const int *k_len;     // NULL: seq_k
    const int *q_offset;  // NULL: 0
    const int *prefix;    // NULL: 0
    const int *doc_id;    // NULL: one document
    stof_i64 doc_stride;
    int *doc_lo, *doc_hi; // batch * seq_k (stof_mb_docs), or NULL
    unsigned char *cls;   // batch * n_rb * n_cb
    int *cnt;             // batch * n_rb * 2
    int *row_ptr;         // batch * n_rb + 1
    int *col_idx;         // tile_cap
    unsigned char *kind;  // tile_cap
    int *bitmap_idx;      // tile_cap
    unsigned *bitmaps;    // pool_cap * block_m * bwpr: the pool of
                          // partial-tile bitmaps
    stof_i64 tile_cap;
    stof_i64 *stats;      // [0] tiles, [1] partial tiles, [2] most tiles
                          // of a row block, [3] overflow (0/1), [4] some
                          // document ids decrease (set by stof_mb_docs,
                          // cleared by stof_mb_scan), [5] [4] of the last
                          // build, [6] pool slots taken (stof_mb_classify;
                          // reset by stof_mb_scan)
    int *tslot;           // batch * n_rb * n_cb: a partial tile's pool
                          // slot, by tile
    stof_i64 pool_cap;    // bitmaps in the pool
    const unsigned long long *seed; // NULL: the spec's SEED as is
    // The packed layout (n_seq > 0): one format (batch 1) over seq_q rows
    // and seq_k keys holding n_seq sequences, sequence b at rows
    // pk[b] .. pk[b + 1] - 1 and keys pk[K + b] .. pk[K + b + 1] - 1
    // (K = n_seq + 1), where stof_mb_seqs writes the caller's cu_q / cu_k
    // clamped to 0..seq_q / seq_k and non-decreasing. Positions and keys
    // of the program are relative to the sequence's first row and key;
    // doc_id and doc_lo / doc_hi are indexed by the packed key.
    const int *cu_q, *cu_k;
    int *pk;
    int n_seq;
    int bitmap_words;      // `bitmap`: words per row
    const unsigned *bitmap; // NULL: every key
    stof_i64 bitmap_stride; // words between sequences (0: shared)
    // Families with head_* leaves: the formats are per (sequence, head),
    // sequence s of the workspace being batch element s / heads_data and
    // head s % heads_data (heads_data 1: per batch element).
    const int *head_window; // per head: the W of head_*; NULL: no limit
    int heads_data;
    // The grouped-query row view of one-row queries: every row of a
    // (padded) sequence is its query row 0, at position q_offset; all rows
    // exist when q_len >= 1.
    int row_one;
};
static_assert(sizeof(stof_mb_params) == 272, "stof_mb_params layout");

struct mb_seq {
    stof_i64 off;   // q_offset
    int ql, kl;     // lengths
    stof_i64 prefix;
    const int *doc; // NULL: one document
    const int *lo, *hi; // document intervals, or NULL (search doc)
    int unsorted;       // some document ids decrease: compare element by
                        // element, classify nothing
    int qs, ks;         // packed: the first row and key (0 when padded)
    unsigned long long seed; // the instance's seed (0: none)
    const unsigned *bm;      // the sequence's bitmap, or NULL (every key)
    int bm_words;
    int has_win;             // head_*: the head's window is set
    stof_i64 win;            // head_*: W (>= 0)
    int one;                 // P.row_one (padded): row r is at position off
};

// Instance data is clamped, never trusted: lengths to 0..seq, offsets and
// prefixes to >= 0 (so nothing is read out of bounds).
__device__ __forceinline__ int mb_clamp(int v, int lo, int hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

// Sequence sq of the workspace (a batch element, or with head_* leaves a
// (batch element, head) pair): its instance data.
__device__ __forceinline__ mb_seq mb_load_seq(const stof_mb_params &P, int sq)
{
    mb_seq s;
    const int hd = P.heads_data > 1 ? P.heads_data : 1;
    const int b = sq / hd, h = sq - b * hd;
    s.has_win = P.head_window != 0;
    // (clamped where no distance reaches, as the host's spec parameters:
    // q_offset <= 2^30 and keys < 2^20, so equal to the host's unclamped W)
    s.win = s.has_win ? mb_clamp(P.head_window[h], 0, (1 << 30) + (1 << 21))
                      : 0;
    if (P.n_seq > 0) {
        const int *pq = P.pk, *pkk = P.pk + P.n_seq + 1;
        s.qs = pq[b];
        s.ql = pq[b + 1] - s.qs;
        s.ks = pkk[b];
        s.kl = pkk[b + 1] - s.ks;
        s.doc = P.doc_id ? P.doc_id + s.ks : 0;
        s.lo = P.doc_lo ? P.doc_lo + s.ks : 0;
        s.hi = P.doc_hi ? P.doc_hi + s.ks : 0;
    } else {
        s.qs = s.ks = 0;
        s.ql = P.q_len ? mb_clamp(P.q_len[b], 0, P.seq_q) : P.seq_q;
        s.kl = P.k_len ? mb_clamp(P.k_len[b], 0, P.seq_k) : P.seq_k;
        s.doc = P.doc_id ? P.doc_id + (stof_i64)b * P.doc_stride : 0;
        // (the document intervals are the workspace's, by sequence)
        s.lo = P.doc_lo ? P.doc_lo + (stof_i64)sq * P.seq_k : 0;
        s.hi = P.doc_hi ? P.doc_hi + (stof_i64)sq * P.seq_k : 0;
    }
    s.one = P.n_seq > 0 ? 0 : P.row_one;
    if (s.one) // q_len counts the one query row: all rows or none
        s.ql = s.ql > 0 ? P.seq_q : 0;
    s.off = P.q_offset ? mb_clamp(P.q_offset[b], 0, 1 << 30) : 0;
    s.prefix = P.prefix ? mb_clamp(P.prefix[b], 0, 1 << 30) : 0;
    s.unsorted = P.stats[4] != 0;
    s.seed = P.seed ? P.seed[b] : 0ull;
    s.bm = P.bitmap ? P.bitmap + (stof_i64)b * P.bitmap_stride : 0;
    s.bm_words = P.bitmap_words;
    return s;
}

// Packed: the sequence holding row (or key) x of offsets a[0..n] (clamped,
// non-decreasing), or -1 when x is in none.
__device__ __forceinline__ int mb_pk_find(const int *a, int n, stof_i64 x)
{
    int lo = 0, hi = n + 1; // the first index with a[i] > x
    while (lo < hi) {
        const int m = (lo + hi) >> 1;
        if (a[m] <= x)
            lo = m + 1;
        else
            hi = m;
    }
    const int b = lo - 1;
    return (b >= 0 && b < n && x < a[b + 1]) ? b : -1;
}

// Packed: the last sequence starting at or before x (0 when none does).
__device__ __forceinline__ int mb_pk_floor(const int *a, int n, stof_i64 x)
{
    int lo = 0, hi = n + 1;
    while (lo < hi) {
        const int m = (lo + hi) >> 1;
        if (a[m] <= x)
            lo = m + 1;
        else
            hi = m;
    }
    return lo - 1 < 0 ? 0 : (lo - 1 > n - 1 ? n - 1 : lo - 1);
}

// ---------------------------------------------------------------------------
// Classification of a rectangle: positions p0..p1 x keys k0..k1
// ---------------------------------------------------------------------------

#define MB_C_UNKNOWN (-1)

__device__ __forceinline__ int mb_band(stof_i64 dmin, stof_i64 dmax,
                                       stof_i64 lo, stof_i64 hi)
{
    if (dmin >= lo && dmax <= hi)
        return MB_FULL;
    if (dmax < lo || dmin > hi)
        return MB_EMPTY;
    return MB_C_UNKNOWN;
}

// ext: the leaf's node (its parameter nodes follow it).
__device__ int mb_leaf_class(int kind, stof_i64 a, stof_i64 bparam,
                             stof_i64 p0, stof_i64 p1, stof_i64 k0,
                             stof_i64 k1, const mb_seq &s, const int *ext)
{
    const stof_i64 dmin = p0 - k1, dmax = p1 - k0;
    const stof_i64 big = (stof_i64)1 << 62;
    switch (kind) {
    case MB_LEAF_DENSE:
        return MB_FULL;
    case MB_LEAF_NONE:
        return MB_EMPTY;
    case MB_LEAF_CAUSAL:
        return mb_band(dmin, dmax, 0, big);
    case MB_LEAF_SLIDING:
        return mb_band(dmin, dmax, -a + 1, a - 1);
    case MB_LEAF_CAUSAL_SLIDING:
        return mb_band(dmin, dmax, 0, a - 1);
    case MB_LEAF_DILATED: {
        int c = mb_band(dmin, dmax, -a + 1, a - 1);
        return (c == MB_EMPTY || bparam == 1) ? c : MB_C_UNKNOWN;
    }
    case MB_LEAF_LONGFORMER: {
        if (p1 < bparam || k1 < bparam)
            return MB_FULL;
        int c = mb_band(dmin, dmax, -a + 1, a - 1);
        if (c == MB_FULL)
            return MB_FULL;
        if (c == MB_EMPTY && p0 >= bparam && k0 >= bparam)
            return MB_EMPTY;
        return MB_C_UNKNOWN;
    }
    case MB_LEAF_STRIDED: {
        int c = mb_band(dmin, dmax, -a + 1, a - 1);
        if (c != MB_EMPTY)
            return c;
        stof_i64 first = k0 + ((a - 1 - k0 % a) + a) % a;
        return first > k1 ? MB_EMPTY : MB_C_UNKNOWN;
    }
    case MB_LEAF_PREFIX: {
        stof_i64 x = bparam >= 0 ? bparam : s.prefix;
        return k1 < x ? MB_FULL : (k0 >= x ? MB_EMPTY : MB_C_UNKNOWN);
    }
    case MB_LEAF_BITMAP:
        return s.bm ? MB_C_UNKNOWN : MB_FULL;
    case MB_LEAF_HEAD_SLIDING:
        return s.has_win ? mb_band(dmin, dmax, -s.win + 1, s.win - 1)
                         : MB_FULL;
    case MB_LEAF_HEAD_CAUSAL_SLIDING:
        return mb_band(dmin, dmax, 0, s.has_win ? s.win - 1 : big);
    case MB_LEAF_BIGBIRD: {
        // Global rows and columns are full; the rest has random blocks:
        // from the elements.
        const stof_i64 gb = (stof_i64)ext[1] * a;
        return (p1 < gb || k1 < gb) ? MB_FULL : MB_C_UNKNOWN;
    }
    case MB_LEAF_DOCS: {
        if (p0 >= s.kl)
            return MB_EMPTY;
        if (s.unsorted && s.doc)
            return MB_C_UNKNOWN;
        if (!s.doc)
            return p1 < s.kl ? MB_FULL : MB_C_UNKNOWN;
        const stof_i64 pl = p1 < s.kl ? p1 : s.kl - 1;
        const int dp0 = s.doc[p0], dpl = s.doc[pl];
        const int dk0 = s.doc[k0], dk1 = s.doc[k1];
        if (dpl < dk0 || dk1 < dp0)
            return MB_EMPTY;
        if (p1 < s.kl && dp0 == dpl && dk0 == dk1 && dp0 == dk0)
            return MB_FULL;
        return MB_C_UNKNOWN;
    }
    }
    return MB_C_UNKNOWN;
}

__device__ int mb_classify(const stof_mb_params &P, stof_i64 p0, stof_i64 p1,
                           stof_i64 k0, stof_i64 k1, const mb_seq &s)
{
    signed char st[MB_MAX_STACK];
    int n = 0;
    for (int i = 0; i < P.n_prog; i++) {
        const int *nd = P.prog + 4 * i;
        const int op = nd[0];
        if (op == MB_OP_LEAF) {
            st[n++] = (signed char)mb_leaf_class(nd[1], nd[2], nd[3], p0, p1,
                                                 k0, k1, s, nd + 4);
            if (nd[1] == MB_LEAF_BIGBIRD)
                i += 2; // its parameter nodes
        } else if (op == MB_OP_NOT) {
            const int c = st[n - 1];
            st[n - 1] = (signed char)(c == MB_FULL    ? MB_EMPTY
                                      : c == MB_EMPTY ? MB_FULL
                                                      : MB_C_UNKNOWN);
        } else {
            const int k = nd[1];
            int all = 1, none = 1, r = MB_C_UNKNOWN;
            for (int j = n - k; j < n; j++) {
                all &= st[j] == MB_FULL;
                none &= st[j] == MB_EMPTY;
                if (op == MB_OP_AND && st[j] == MB_EMPTY)
                    r = MB_EMPTY;
                if (op == MB_OP_OR && st[j] == MB_FULL)
                    r = MB_FULL;
            }
            if (r == MB_C_UNKNOWN) {
                if (op == MB_OP_AND && all)
                    r = MB_FULL;
                if (op == MB_OP_OR && none)
                    r = MB_EMPTY;
            }
            n -= k;
            st[n++] = (signed char)r;
        }
    }
    return st[0];
}

// ---------------------------------------------------------------------------
// Elements: 32 keys c0 .. c0+31 of position p
// ---------------------------------------------------------------------------

// Bits of the keys in [lo, hi) among c0 .. c0+31.
__device__ __forceinline__ unsigned mb_range(stof_i64 lo, stof_i64 hi,
                                             stof_i64 c0)
{
    if (lo < c0)
        lo = c0;
    if (hi > c0 + 32)
        hi = c0 + 32;
    if (lo >= hi)
        return 0u;
    const int a = (int)(lo - c0), b = (int)(hi - c0);
    const unsigned upto = b == 32 ? 0xffffffffu : ((1u << b) - 1u);
    return upto & ~((1u << a) - 1u);
}

// Bits of the keys k with k % m == r among c0 .. c0+31.
__device__ __forceinline__ unsigned mb_residue(stof_i64 m, stof_i64 r,
                                               stof_i64 c0)
{
    unsigned x = 0;
    stof_i64 k = c0 + (((r - c0) % m) + m) % m;
    for (; k < c0 + 32; k += m)
        x |= 1u << (int)(k - c0);
    return x;
}

// The document interval [lo, hi) of position p (sorted ids).
__device__ void mb_doc(const mb_seq &s, stof_i64 p, stof_i64 *lo,
                       stof_i64 *hi)
{
    if (p < 0 || p >= s.kl) {
        *lo = *hi = 0;
        return;
    }
    if (!s.doc) {
        *lo = 0;
        *hi = s.kl;
        return;
    }
    if (s.lo) {
        *lo = s.lo[p];
        *hi = s.hi[p];
        return;
    }
    const int id = s.doc[p];
    stof_i64 l = 0, h = p;
    while (l < h) {
        stof_i64 m = l + (h - l) / 2;
        if (s.doc[m] < id)
            l = m + 1;
        else
            h = m;
    }
    *lo = l;
    l = p + 1;
    h = s.kl;
    while (l < h) {
        stof_i64 m = l + (h - l) / 2;
        if (s.doc[m] <= id)
            l = m + 1;
        else
            h = m;
    }
    *hi = l;
}

__device__ __forceinline__ unsigned long long mb_splitmix(unsigned long long *x)
{
    unsigned long long z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Bigbird (spec_eval.c's bigbird_block_row, the same draws): the row of
// block row i = p / B has the G global block columns, the W window blocks
// around i, and R distinct random block columns drawn by Floyd's algorithm
// from splitmix64 seeded with SEED and i; rows of the G global block rows,
// and every row when R covers the key blocks, are full.
__device__ unsigned mb_bigbird_word(stof_i64 B, stof_i64 W, const int *ext,
                                    stof_i64 p, stof_i64 c0, const mb_seq &s)
{
    const stof_i64 G = ext[1], R = ext[2];
    unsigned long long seed = (unsigned long long)(unsigned)ext[5] |
                              ((unsigned long long)(unsigned)ext[6] << 32);
    if (s.seed) {
        // spec_eval.c's leaf_seed: SEED ^ mix64(seed ^ constant).
        unsigned long long z = s.seed ^ 0x5851f42d4c957f2dull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        seed ^= z ^ (z >> 31);
    }
    const stof_i64 i = p / B, nbk = (s.kl + B - 1) / B;
    if (i < G || R >= nbk)
        return mb_range(0, s.kl, c0);
    unsigned x = mb_range(0, G * B, c0);
    stof_i64 jlo = i - (W - 1) / 2, jhi = i + W / 2;
    jlo = jlo < 0 ? 0 : jlo;
    jhi = jhi > nbk - 1 ? nbk - 1 : jhi;
    if (jlo <= jhi)
        x |= mb_range(jlo * B, (jhi + 1) * B, c0);
    if (R <= 0)
        return x;
    unsigned long long z = (unsigned long long)i + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    unsigned long long st = seed ^ (z ^ (z >> 31));
    stof_i64 chosen[MB_MAX_RANDOM];
    for (stof_i64 j = nbk - R, n = 0; j < nbk; j++, n++) {
        stof_i64 t = (stof_i64)(mb_splitmix(&st) % (unsigned long long)(j + 1));
        for (stof_i64 u = 0; u < n; u++)
            if (chosen[u] == t) {
                t = j;
                break;
            }
        chosen[n] = t;
        x |= mb_range(t * B, (t + 1) * B, c0);
    }
    return x;
}

// Keys c0 .. c0+31 (any c0) of row q of the sequence's bitmap; only words
// over keys 0 .. kl-1 are read (the caller masks the rest).
__device__ unsigned mb_bitmap_word(const mb_seq &s, stof_i64 q, stof_i64 c0)
{
    if (!s.bm)
        return 0xffffffffu;
    if (q < 0 || q >= s.ql)
        return 0u;
    const unsigned *row = s.bm + q * s.bm_words;
    const stof_i64 n32 = ((stof_i64)s.kl + 31) / 32;
    const stof_i64 w = c0 >= 0 ? c0 / 32 : -((31 - c0) / 32); // floor
    const int sh = (int)(c0 - w * 32);
    const unsigned lo = w >= 0 && w < n32 ? row[w] : 0u;
    const unsigned hi = sh && w + 1 >= 0 && w + 1 < n32 ? row[w + 1] : 0u;
    return sh ? (lo >> sh) | (hi << (32 - sh)) : lo;
}

__device__ unsigned mb_leaf_word(int kind, stof_i64 a, stof_i64 bparam,
                                 stof_i64 p, stof_i64 c0, const mb_seq &s,
                                 const int *ext)
{
    switch (kind) {
    case MB_LEAF_DENSE:
        return mb_range(0, s.kl, c0);
    case MB_LEAF_NONE:
        return 0u;
    case MB_LEAF_CAUSAL:
        return mb_range(0, p + 1, c0);
    case MB_LEAF_SLIDING:
        return mb_range(p - a + 1, p + a, c0);
    case MB_LEAF_CAUSAL_SLIDING:
        return mb_range(p - a + 1, p + 1, c0);
    case MB_LEAF_DILATED:
        return mb_range(p - a + 1, p + a, c0) & mb_residue(bparam, p, c0);
    case MB_LEAF_LONGFORMER:
        if (p < bparam)
            return mb_range(0, s.kl, c0);
        return mb_range(p - a + 1, p + a, c0) | mb_range(0, bparam, c0);
    case MB_LEAF_STRIDED:
        return mb_range(p - a + 1, p + a, c0) | mb_residue(a, a - 1, c0);
    case MB_LEAF_PREFIX:
        return mb_range(0, bparam >= 0 ? bparam : s.prefix, c0);
    case MB_LEAF_BITMAP:
        return mb_bitmap_word(s, p - s.off, c0);
    case MB_LEAF_HEAD_SLIDING:
        return s.has_win ? mb_range(p - s.win + 1, p + s.win, c0)
                         : mb_range(0, s.kl, c0);
    case MB_LEAF_HEAD_CAUSAL_SLIDING:
        return mb_range(s.has_win ? p - s.win + 1 : 0, p + 1, c0);
    case MB_LEAF_BIGBIRD:
        return mb_bigbird_word(a, bparam, ext, p, c0, s);
    case MB_LEAF_DOCS: {
        if (s.unsorted && s.doc) {
            if (p >= s.kl)
                return 0u;
            const int id = s.doc[p];
            unsigned x = 0;
            for (int c = c0 < 0 ? (int)(-c0 < 32 ? -c0 : 32) : 0;
                 c < 32 && c0 + c < s.kl; c++)
                x |= (unsigned)(s.doc[c0 + c] == id) << c;
            return x;
        }
        stof_i64 lo, hi;
        mb_doc(s, p, &lo, &hi);
        return mb_range(lo, hi, c0);
    }
    }
    return 0u;
}

// Keys c0 .. c0+31 of position p (bits at or past k_len are 0).
__device__ unsigned mb_word(const stof_mb_params &P, stof_i64 p, stof_i64 c0,
                            const mb_seq &s)
{
    const unsigned valid = mb_range(0, s.kl, c0);
    unsigned st[MB_MAX_STACK];
    int n = 0;
    for (int i = 0; i < P.n_prog; i++) {
        const int *nd = P.prog + 4 * i;
        const int op = nd[0];
        if (op == MB_OP_LEAF) {
            st[n++] = mb_leaf_word(nd[1], nd[2], nd[3], p, c0, s, nd + 4) &
                      valid;
            if (nd[1] == MB_LEAF_BIGBIRD)
                i += 2; // its parameter nodes
        } else if (op == MB_OP_NOT) {
            st[n - 1] = ~st[n - 1] & valid;
        } else {
            const int k = nd[1];
            unsigned r = st[n - k];
            for (int j = n - k + 1; j < n; j++)
                r = op == MB_OP_AND ? (r & st[j]) : (r | st[j]);
            n -= k;
            st[n++] = r;
        }
    }
    return st[0];
}

// Packed: the keys c0 .. c0+31 (packed key indices) of packed row r.
__device__ unsigned mb_pk_word(const stof_mb_params &P, stof_i64 r,
                               stof_i64 c0)
{
    const int b = mb_pk_find(P.pk, P.n_seq, r);
    if (b < 0)
        return 0u;
    const mb_seq s = mb_load_seq(P, b);
    return mb_word(P, r - s.qs + s.off, c0 - s.ks, s);
}

// Packed: the class of rows r0 .. r0+rows-1 x keys c0 .. c0+cols-1 (packed
// indices, inside seq_q x seq_k): the union over the sequences it meets,
// each classified on its own part; full only when one sequence covers the
// whole rectangle and finds it full.
__device__ int mb_pk_classify(const stof_mb_params &P, stof_i64 r0, int rows,
                              stof_i64 c0, int cols)
{
    const int *pq = P.pk, *pkk = P.pk + P.n_seq + 1;
    const stof_i64 r1 = r0 + rows, c1 = c0 + cols; // exclusive
    int b0 = mb_pk_floor(pq, P.n_seq, r0), e0 = mb_pk_floor(pq, P.n_seq, r1 - 1);
    const int k0 = mb_pk_floor(pkk, P.n_seq, c0),
              k1 = mb_pk_floor(pkk, P.n_seq, c1 - 1);
    b0 = b0 > k0 ? b0 : k0;
    e0 = e0 < k1 ? e0 : k1;
    for (int b = b0; b <= e0; b++) {
        const stof_i64 qa = pq[b] > r0 ? pq[b] : r0;
        const stof_i64 qb = pq[b + 1] < r1 ? pq[b + 1] : r1;
        const stof_i64 ka = pkk[b] > c0 ? pkk[b] : c0;
        const stof_i64 kb = pkk[b + 1] < c1 ? pkk[b + 1] : c1;
        if (qa >= qb || ka >= kb)
            continue;
        const mb_seq s = mb_load_seq(P, b);
        const int c = mb_classify(P, qa - s.qs + s.off, qb - 1 - s.qs + s.off,
                                  ka - s.ks, kb - 1 - s.ks, s);
        if (c == MB_EMPTY)
            continue;
        if (c == MB_FULL && qa == r0 && qb == r1 && ka == c0 && kb == c1)
            return MB_FULL;
        return MB_C_UNKNOWN;
    }
    return MB_EMPTY;
}

#endif // STOF_MASK_EVAL_CUH
