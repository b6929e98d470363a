// mask_build.cu - the block-wise sparse format of a mask family built on
// the GPU, per sequence, from the family's program and the batch's instance
// data (lengths, query offsets, prefixes, document ids), into a workspace
// the plan owns: no host work, no allocation, no synchronisation.
//
// The format is the one stof_format_build makes from the seq_q x seq_k mask
// of sequence b (padding rows and keys are 0), with the tile lists of all
// sequences in one array: sequence b's row block i owns entries
// row_ptr[b * n_rb + i] .. row_ptr[b * n_rb + i + 1] - 1 of col_idx, kind
// and bitmap_idx. A partial tile's bitmap sits at its slot: bitmap_idx =
// (b * n_rb + i) * n_cb + j for key block j (so the bitmaps are written
// where they are computed, once).
//
// Kernels, in this order on one stream:
//   stof_mb_docs      grid (ceil(seq_k / 256), batch), only for programs
//                     with `docs` and document ids: the document interval
//                     [doc_lo, doc_hi) of every key position.
//   stof_mb_classify  grid (n_rb, batch): the class of every tile, from the
//                     program's interval analysis, and for tiles it leaves
//                     unknown, from their elements (the whole CTA on one
//                     tile at a time, writing its bitmap at its slot); the
//                     non-empty and partial tiles of each row block.
//   stof_mb_scan      one CTA: prefix sums of the non-empty tiles
//                     (row_ptr) and the statistics (tiles, partial tiles,
//                     most tiles of a row block, overflow).
//   stof_mb_fill      grid (n_rb, batch): the tile lists in ascending key
//                     block order.
//
// The program is the spec in postfix order, four ints a node:
//   {MB_OP_LEAF, kind, a, b}  a leaf (its parameters a, b)
//   {MB_OP_AND or MB_OP_OR, n, 0, 0}  combines the last n values
//   {MB_OP_NOT, 0, 0, 0}
// Elements: query row q of sequence b sits at key position
// p = q + q_offset[b]; keys at or past k_len[b] and rows at or past
// q_len[b] are never allowed.
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
#define MB_LEAF_STRIDED 8
#define MB_LEAF_DOCS 10
#define MB_LEAF_PREFIX 11
#endif

#define MB_OP_LEAF 0
#define MB_OP_AND 1
#define MB_OP_OR 2
#define MB_OP_NOT 3
#define MB_MAX_STACK 32
#define MB_THREADS 256

#define MB_EMPTY 0
#define MB_PARTIAL 1
#define MB_FULL 2
#define MB_UNKNOWN 3

// Must match stof_mb_params in src/kernels/mask_build.h.
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
    unsigned *bitmaps;    // tile_cap * block_m * bwpr (by slot)
    stof_i64 tile_cap;
    stof_i64 *stats;      // [0] tiles, [1] partial tiles, [2] most tiles
                          // of a row block, [3] overflow (0/1), [4] some
                          // document ids decrease (set by stof_mb_docs,
                          // cleared by stof_mb_scan), [5] [4] of the last
                          // build
};

struct mb_seq {
    stof_i64 off;   // q_offset
    int ql, kl;     // lengths
    stof_i64 prefix;
    const int *doc; // NULL: one document
    const int *lo, *hi; // document intervals, or NULL (search doc)
    int unsorted;       // some document ids decrease: compare element by
                        // element, classify nothing
};

// Instance data is clamped, never trusted: lengths to 0..seq, offsets and
// prefixes to >= 0 (so nothing is read out of bounds).
__device__ __forceinline__ int mb_clamp(int v, int lo, int hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

__device__ __forceinline__ mb_seq mb_load_seq(const stof_mb_params &P, int b)
{
    mb_seq s;
    s.ql = P.q_len ? mb_clamp(P.q_len[b], 0, P.seq_q) : P.seq_q;
    s.kl = P.k_len ? mb_clamp(P.k_len[b], 0, P.seq_k) : P.seq_k;
    s.off = P.q_offset ? mb_clamp(P.q_offset[b], 0, 1 << 30) : 0;
    s.prefix = P.prefix ? mb_clamp(P.prefix[b], 0, 1 << 30) : 0;
    s.unsorted = P.stats[4] != 0;
    s.doc = P.doc_id ? P.doc_id + (stof_i64)b * P.doc_stride : 0;
    s.lo = P.doc_lo ? P.doc_lo + (stof_i64)b * P.seq_k : 0;
    s.hi = P.doc_hi ? P.doc_hi + (stof_i64)b * P.seq_k : 0;
    return s;
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

__device__ int mb_leaf_class(int kind, stof_i64 a, stof_i64 bparam,
                             stof_i64 p0, stof_i64 p1, stof_i64 k0,
                             stof_i64 k1, const mb_seq &s)
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
                                                 k0, k1, s);
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

__device__ unsigned mb_leaf_word(int kind, stof_i64 a, stof_i64 bparam,
                                 stof_i64 p, stof_i64 c0, const mb_seq &s)
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
    case MB_LEAF_DOCS: {
        if (s.unsorted && s.doc) {
            if (p >= s.kl)
                return 0u;
            const int id = s.doc[p];
            unsigned x = 0;
            for (int c = 0; c < 32 && c0 + c < s.kl; c++)
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
            st[n++] = mb_leaf_word(nd[1], nd[2], nd[3], p, c0, s) & valid;
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

// ---------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------

__device__ __forceinline__ int mb_warp_sum(int v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The bitmap word t of row r of the tile at key block j (0 past the rows).
__device__ __forceinline__ unsigned mb_tile_word(const stof_mb_params &P,
                                                 const mb_seq &s,
                                                 stof_i64 p0, int rows,
                                                 int j, int r, int t)
{
    if (r >= rows)
        return 0u;
    unsigned x = mb_word(P, p0 + r, (stof_i64)j * P.block_n + 32 * t, s);
    return P.block_n == 16 ? (x & 0xffffu) : x;
}

extern "C" __global__ void __launch_bounds__(MB_THREADS)
stof_mb_docs(const stof_mb_params P)
{
    const int b = blockIdx.y;
    const stof_i64 p = (stof_i64)blockIdx.x * MB_THREADS + threadIdx.x;
    if (p >= P.seq_k)
        return;
    mb_seq s = mb_load_seq(P, b);
    s.lo = s.hi = 0; // search the ids
    s.unsorted = 0;
    if (p >= 1 && p < s.kl && s.doc[p] < s.doc[p - 1])
        atomicExch((unsigned long long *)(P.stats + 4), 1ull);
    stof_i64 lo = 0, hi = 0;
    mb_doc(s, p, &lo, &hi);
    P.doc_lo[(stof_i64)b * P.seq_k + p] = (int)lo;
    P.doc_hi[(stof_i64)b * P.seq_k + p] = (int)hi;
}

// Sum over the CTA (every thread gets it); red: MB_THREADS / 32 ints.
__device__ __forceinline__ int mb_cta_sum(int v, int *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = mb_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    int t = 0;
    for (int w = 0; w < MB_THREADS / 32; w++)
        t += red[w];
    return t;
}

extern "C" __global__ void __launch_bounds__(MB_THREADS)
stof_mb_classify(const stof_mb_params P)
{
    const int i = blockIdx.x, b = blockIdx.y;
    const int tid = threadIdx.x;
    const mb_seq s = mb_load_seq(P, b);
    const int r0 = i * P.block_m;
    int rows = s.ql - r0;
    rows = rows < 0 ? 0 : (rows > P.block_m ? P.block_m : rows);
    int rows_pad = P.seq_q - r0;
    rows_pad = rows_pad > P.block_m ? P.block_m : rows_pad;
    const stof_i64 p0 = r0 + s.off, p1 = p0 + rows - 1;
    const stof_i64 e = (stof_i64)b * P.n_rb + i;
    unsigned char *cls = P.cls + e * P.n_cb;
    const int words = P.block_m * P.bwpr;

    __shared__ int s_list[MB_THREADS];
    __shared__ int s_n;
    __shared__ int s_red[MB_THREADS / 32];
    int nt = 0, np = 0; // this thread's tiles (classified by it)
    for (int base = 0; base < P.n_cb; base += MB_THREADS) {
        if (tid == 0)
            s_n = 0;
        __syncthreads();
        const int j = base + tid;
        if (j < P.n_cb) {
            int c = MB_EMPTY;
            const stof_i64 k0 = (stof_i64)j * P.block_n;
            if (rows > 0 && k0 < s.kl) {
                stof_i64 k1 = k0 + P.block_n - 1;
                if (k1 > s.kl - 1)
                    k1 = s.kl - 1;
                c = mb_classify(P, p0, p1, k0, k1, s);
                // Full in the sequence but smaller than the padded tile:
                // partial, with a bitmap to write.
                const stof_i64 cols_pad =
                    P.seq_k - k0 < P.block_n ? P.seq_k - k0 : P.block_n;
                if (c == MB_FULL &&
                    (rows < rows_pad || k1 - k0 + 1 < cols_pad))
                    c = MB_C_UNKNOWN;
            }
            if (c == MB_C_UNKNOWN) {
                s_list[atomicAdd(&s_n, 1)] = j;
                c = MB_UNKNOWN;
            } else {
                nt += c != MB_EMPTY;
            }
            cls[j] = (unsigned char)c;
        }
        __syncthreads();
        // The unknown tiles from their elements, the whole CTA on each:
        // the bitmap goes to the tile's slot, the count decides the class.
        const int n_unknown = s_n;
        for (int t = 0; t < n_unknown; t++) {
            const int jj = s_list[t];
            const stof_i64 c0 = (stof_i64)jj * P.block_n;
            const int cols_pad =
                (int)(P.seq_k - c0 < P.block_n ? P.seq_k - c0 : P.block_n);
            unsigned *dst = P.bitmaps + (e * P.n_cb + jj) * (stof_i64)words;
            int pop = 0;
            for (int w = tid; w < words; w += MB_THREADS) {
                const unsigned x =
                    mb_tile_word(P, s, p0, rows, jj, w / P.bwpr, w % P.bwpr);
                dst[w] = x;
                pop += __popc(x);
            }
            pop = mb_cta_sum(pop, s_red);
            if (tid == 0) {
                const int c = pop == 0                      ? MB_EMPTY
                              : pop == rows_pad * cols_pad ? MB_FULL
                                                           : MB_PARTIAL;
                cls[jj] = (unsigned char)c;
                nt += c != MB_EMPTY;
                np += c == MB_PARTIAL;
            }
        }
        __syncthreads(); // s_n and s_list are reused
    }
    nt = mb_cta_sum(nt, s_red);
    np = mb_cta_sum(np, s_red);
    if (tid == 0) {
        P.cnt[2 * e] = nt;
        P.cnt[2 * e + 1] = np;
    }
}

#define MB_SCAN_THREADS 1024

extern "C" __global__ void __launch_bounds__(MB_SCAN_THREADS)
stof_mb_scan(const stof_mb_params P)
{
    const int tid = threadIdx.x;
    const stof_i64 m = (stof_i64)P.batch * P.n_rb;
    const stof_i64 per = (m + MB_SCAN_THREADS - 1) / MB_SCAN_THREADS;
    const stof_i64 lo = tid * per < m ? tid * per : m;
    const stof_i64 hi = lo + per < m ? lo + per : m;
    stof_i64 t = 0, p = 0, most = 0;
    for (stof_i64 e = lo; e < hi; e++) {
        t += P.cnt[2 * e];
        p += P.cnt[2 * e + 1];
        most = P.cnt[2 * e] > most ? P.cnt[2 * e] : most;
    }
    __shared__ stof_i64 s_t[MB_SCAN_THREADS], s_p[MB_SCAN_THREADS];
    __shared__ stof_i64 s_m[MB_SCAN_THREADS];
    s_t[tid] = t;
    s_p[tid] = p;
    s_m[tid] = most;
    __syncthreads();
    // Inclusive scan (Hillis-Steele) of the per-thread sums.
    for (int o = 1; o < MB_SCAN_THREADS; o <<= 1) {
        stof_i64 a = tid >= o ? s_t[tid - o] : 0;
        stof_i64 c = tid >= o ? s_p[tid - o] : 0;
        stof_i64 d = tid >= o ? s_m[tid - o] : 0;
        __syncthreads();
        s_t[tid] += a;
        s_p[tid] += c;
        s_m[tid] = d > s_m[tid] ? d : s_m[tid];
        __syncthreads();
    }
    const stof_i64 total_t = s_t[MB_SCAN_THREADS - 1];
    // Never with a workspace sized for every tile; checked all the same.
    const int overflow = total_t > P.tile_cap;
    stof_i64 rt = s_t[tid] - t;
    for (stof_i64 e = lo; e < hi; e++) {
        P.row_ptr[e] = overflow ? 0 : (int)rt;
        rt += P.cnt[2 * e];
    }
    if (tid == MB_SCAN_THREADS - 1) {
        P.row_ptr[m] = overflow ? 0 : (int)total_t;
        P.stats[0] = total_t;
        P.stats[1] = s_p[MB_SCAN_THREADS - 1];
        P.stats[2] = s_m[MB_SCAN_THREADS - 1];
        P.stats[3] = overflow;
        P.stats[5] = P.stats[4]; // this build's, for the host to read
        P.stats[4] = 0;          // the next build's docs kernel sets it
    }
}

extern "C" __global__ void __launch_bounds__(MB_THREADS)
stof_mb_fill(const stof_mb_params P)
{
    const int i = blockIdx.x, b = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const stof_i64 e = (stof_i64)b * P.n_rb + i;
    if (P.stats[3])
        return;
    const unsigned char *cls = P.cls + e * P.n_cb;

    __shared__ int s_wt[MB_THREADS / 32];
    __shared__ int s_ct;
    stof_i64 rt = P.row_ptr[e];
    for (int base = 0; base < P.n_cb; base += MB_THREADS) {
        const int j = base + tid;
        const int c = j < P.n_cb ? cls[j] : MB_EMPTY;
        const unsigned bt = __ballot_sync(0xffffffffu, c != MB_EMPTY);
        if (lane == 0)
            s_wt[warp] = __popc(bt);
        __syncthreads();
        int at = 0;
        for (int w = 0; w < warp; w++)
            at += s_wt[w];
        at += __popc(bt & ((1u << lane) - 1u));
        if (c != MB_EMPTY) {
            const stof_i64 x = rt + at;
            P.col_idx[x] = j;
            P.kind[x] = (unsigned char)c;
            P.bitmap_idx[x] = c == MB_PARTIAL ? (int)(e * P.n_cb + j) : -1;
        }
        if (tid == MB_THREADS - 1)
            s_ct = at + (c != MB_EMPTY);
        __syncthreads();
        rt += s_ct;
        __syncthreads();
    }
}
