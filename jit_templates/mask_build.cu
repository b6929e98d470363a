// mask_build.cu - the block-wise sparse format of a mask family built on
// the GPU, per sequence, from the family's program and the batch's instance
// data (lengths, query offsets, prefixes, document ids), into a workspace
// the plan owns: no host work, no allocation, no synchronisation.
//
// The format is the one stof_format_build makes from the seq_q x seq_k mask
// of sequence b (padding rows and keys are 0), with the tile lists of all
// sequences in one array: sequence b's row block i owns entries
// row_ptr[b * n_rb + i] .. row_ptr[b * n_rb + i + 1] - 1 of col_idx, kind
// and bitmap_idx. Partial tiles take the slots of a bitmap pool in the
// order they are found (bitmap_idx, any order); the pool holds pool_cap
// bitmaps, which the host sizes from the program so that no instance
// overflows it (mask_build.c: the tiles a mask's boundary lines can cross),
// and every tile when a leaf has no such bound. The index arrays hold every
// tile. Memory follows the tiles, not the elements.
//
// The packed layout (P.n_seq > 0, batch 1): one format over the packed
// rows and keys, holding sequence b's mask on its diagonal block (where
// the clamped offsets put it) and nothing between sequences; tiles find
// the sequences they meet (mask_eval.cuh, mb_pk_classify / mb_pk_word).
//
// Kernels, in this order on one stream:
//   stof_mb_seqs      one CTA, packed only: the run's offsets clamped.
//   stof_mb_docs      grid (ceil(seq_k / 256), batch), only for programs
//                     with `docs` and document ids: the document interval
//                     [doc_lo, doc_hi) of every key position.
//   stof_mb_classify  grid (n_rb, batch): the class of every tile, from the
//                     program's interval analysis, and for tiles it leaves
//                     unknown, from their elements (the whole CTA on one
//                     tile at a time; a partial tile's bitmap goes to the
//                     next free pool slot); the
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
#include "mask_eval.cuh"

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
    unsigned x = mb_word(P, p0 + (s.one ? 0 : r),
                         (stof_i64)j * P.block_n + 32 * t, s);
    return P.block_n == 16 ? (x & 0xffffu) : x;
}

#define MB_SEQS_THREADS 1024

// Packed layout: the caller's offsets cu_q / cu_k (n_seq + 1 each)
// clamped to 0..seq_q / 0..seq_k and made non-decreasing (each at least
// the one before: a sequence that would start before its predecessor ends
// starts there), into pk. One CTA: per-thread runs, then a running max.
extern "C" __global__ void __launch_bounds__(MB_SEQS_THREADS)
stof_mb_seqs(const stof_mb_params P)
{
    const int tid = threadIdx.x, n = P.n_seq + 1;
    const int per = (n + MB_SEQS_THREADS - 1) / MB_SEQS_THREADS;
    const int lo = tid * per < n ? tid * per : n;
    const int hi = lo + per < n ? lo + per : n;
    __shared__ int s_m[MB_SEQS_THREADS];
    for (int w = 0; w < 2; w++) {
        const int *cu = w == 0 ? P.cu_q : (P.cu_k ? P.cu_k : P.cu_q);
        const int lim = w == 0 ? P.seq_q : P.seq_k;
        int *out = P.pk + w * n;
        int m = 0;
        for (int i = lo; i < hi; i++) {
            const int v = mb_clamp(cu[i], 0, lim);
            m = v > m ? v : m;
        }
        s_m[tid] = m;
        __syncthreads();
        for (int o = 1; o < MB_SEQS_THREADS; o <<= 1) {
            const int a = tid >= o ? s_m[tid - o] : 0;
            __syncthreads();
            s_m[tid] = a > s_m[tid] ? a : s_m[tid];
            __syncthreads();
        }
        m = tid > 0 ? s_m[tid - 1] : 0;
        for (int i = lo; i < hi; i++) {
            const int v = mb_clamp(cu[i], 0, lim);
            m = v > m ? v : m;
            out[i] = m;
        }
        __syncthreads(); // s_m is reused
    }
}

// Packed: the bitmap word t of row r of the tile at key block j.
__device__ __forceinline__ unsigned mb_pk_tile_word(const stof_mb_params &P,
                                                    int r0, int rows, int j,
                                                    int r, int t)
{
    if (r >= rows)
        return 0u;
    const stof_i64 c0 = (stof_i64)j * P.block_n + 32 * t;
    unsigned x = c0 < P.seq_k ? mb_pk_word(P, (stof_i64)r0 + r, c0) : 0u;
    if (P.seq_k - c0 < 32)
        x &= P.seq_k - c0 <= 0 ? 0u : (1u << (int)(P.seq_k - c0)) - 1u;
    return P.block_n == 16 ? (x & 0xffffu) : x;
}

extern "C" __global__ void __launch_bounds__(MB_THREADS)
stof_mb_docs(const stof_mb_params P)
{
    int b = blockIdx.y;
    const stof_i64 x = (stof_i64)blockIdx.x * MB_THREADS + threadIdx.x;
    if (x >= P.seq_k)
        return;
    stof_i64 p = x; // the key within its sequence
    if (P.n_seq > 0) {
        b = mb_pk_find(P.pk + P.n_seq + 1, P.n_seq, x);
        if (b < 0) {
            P.doc_lo[x] = P.doc_hi[x] = 0;
            return;
        }
    }
    mb_seq s = mb_load_seq(P, b);
    s.lo = s.hi = 0; // search the ids
    s.unsorted = 0;
    p -= s.ks;
    if (p >= 1 && p < s.kl && s.doc[p] < s.doc[p - 1])
        atomicExch((unsigned long long *)(P.stats + 4), 1ull);
    stof_i64 lo = 0, hi = 0;
    mb_doc(s, p, &lo, &hi);
    const stof_i64 at = P.n_seq > 0 ? x : (stof_i64)b * P.seq_k + p;
    P.doc_lo[at] = (int)lo;
    P.doc_hi[at] = (int)hi;
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
    // Packed: one sequence of seq_q rows made of P.n_seq; each tile and
    // element finds its own (s is unused).
    const int pk = P.n_seq > 0;
    const mb_seq s = pk ? mb_seq{} : mb_load_seq(P, b);
    const int r0 = i * P.block_m;
    int rows_pad = P.seq_q - r0;
    rows_pad = rows_pad > P.block_m ? P.block_m : rows_pad;
    int rows = pk ? rows_pad : s.ql - r0;
    rows = rows < 0 ? 0 : (rows > P.block_m ? P.block_m : rows);
    // Positions of the rows (all the query row's with row_one).
    const stof_i64 p0 = (s.one ? 0 : r0) + s.off,
                   p1 = s.one ? p0 : p0 + rows - 1;
    const stof_i64 e = (stof_i64)b * P.n_rb + i;
    unsigned char *cls = P.cls + e * P.n_cb;
    const int words = P.block_m * P.bwpr;

    __shared__ int s_list[MB_THREADS];
    __shared__ int s_n, s_slot;
    __shared__ int s_red[MB_THREADS / 32];
    __shared__ unsigned s_bits[MB_MAX_TILE_WORDS];
    int nt = 0, np = 0; // this thread's tiles (classified by it)
    for (int base = 0; base < P.n_cb; base += MB_THREADS) {
        if (tid == 0)
            s_n = 0;
        __syncthreads();
        const int j = base + tid;
        if (j < P.n_cb) {
            int c = MB_EMPTY;
            const stof_i64 k0 = (stof_i64)j * P.block_n;
            if (pk) {
                const int cols =
                    (int)(P.seq_k - k0 < P.block_n ? P.seq_k - k0 : P.block_n);
                c = rows > 0 ? mb_pk_classify(P, r0, rows, k0, cols)
                             : MB_EMPTY;
            } else if (rows > 0 && k0 < s.kl) {
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
        // the count decides the class; a partial tile's bitmap goes from
        // shared memory to the next pool slot.
        const int n_unknown = s_n;
        for (int t = 0; t < n_unknown; t++) {
            const int jj = s_list[t];
            const stof_i64 c0 = (stof_i64)jj * P.block_n;
            const int cols_pad =
                (int)(P.seq_k - c0 < P.block_n ? P.seq_k - c0 : P.block_n);
            int pop = 0;
            for (int w = tid; w < words; w += MB_THREADS) {
                const unsigned x =
                    pk ? mb_pk_tile_word(P, r0, rows, jj, w / P.bwpr,
                                         w % P.bwpr)
                       : mb_tile_word(P, s, p0, rows, jj, w / P.bwpr,
                                      w % P.bwpr);
                s_bits[w] = x;
                pop += __popc(x);
            }
            pop = mb_cta_sum(pop, s_red); // also orders s_bits
            if (tid == 0) {
                const int c = pop == 0                      ? MB_EMPTY
                              : pop == rows_pad * cols_pad ? MB_FULL
                                                           : MB_PARTIAL;
                cls[jj] = (unsigned char)c;
                nt += c != MB_EMPTY;
                np += c == MB_PARTIAL;
                int slot = -1;
                if (c == MB_PARTIAL) {
                    const stof_i64 x = (stof_i64)atomicAdd(
                        (unsigned long long *)(P.stats + 6), 1ull);
                    slot = x < P.pool_cap ? (int)x : -1;
                }
                P.tslot[e * P.n_cb + jj] = slot;
                s_slot = slot;
            }
            __syncthreads();
            if (s_slot >= 0) {
                unsigned *dst = P.bitmaps + (stof_i64)s_slot * words;
                for (int w = tid; w < words; w += MB_THREADS)
                    dst[w] = s_bits[w];
            }
            __syncthreads(); // s_bits and s_slot are reused
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
    // Never with a workspace of stof__mb_workspace_new (every tile has an
    // index, and the pool holds the most partial tiles the program can
    // make); checked all the same. One thread reads the pool counter
    // before anyone resets it, and every thread takes its verdict.
    __shared__ int s_over;
    if (tid == 0)
        s_over = total_t > P.tile_cap || P.stats[6] > P.pool_cap;
    __syncthreads();
    const int overflow = s_over;
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
        P.stats[6] = 0;          // the next build's pool
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
            P.bitmap_idx[x] = c == MB_PARTIAL ? P.tslot[e * P.n_cb + j] : -1;
        }
        if (tid == MB_THREADS - 1)
            s_ct = at + (c != MB_EMPTY);
        __syncthreads();
        rt += s_ct;
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------
// Row-wise formats (the gather kernels' compacted key lists) of the default
// instance of one sequence, built once for a plan (mask_build.h,
// stof__mb_rowwise_build). Format row f of block i is query row
// mb_rw_row(f): rows in order, or grouped by residue class mod `group`
// (class r: r, r + group, ...; as stof__mask_group_rows orders them).
//   stof_mb_rw_or    grid (n_rb, ceil(n_words / 32)): the OR of the
//                    block's rows per 32 keys, and the number of listed
//                    keys of each block
//   (the host sums them into key_ptr, tile_ptr and row_off)
//   stof_mb_rw_keys  grid (n_rb): the key lists
//   stof_mb_rw_bits  grid (n_rb, rows x words / MB_THREADS): each row's
//                    bits over its block's listed keys, a word a thread
//   stof_mb_rw_tiles grid (n_rb): the tiles of block_n listed keys, a warp
//                    each: full, or partial with a bitmap in the next slot
// ---------------------------------------------------------------------------

struct stof_mb_rw {
    int group;            // row period (1: rows in order)
    int n_words;          // ceil(seq_k / 32)
    unsigned *orw;        // n_rb * n_words
    int *nk;              // n_rb
    const int *key_ptr;   // n_rb + 1
    int *keys;            // key_ptr[n_rb]
    const long long *row_off; // n_rb + 1: block i's rows' bits, in words
    unsigned *row_bits;   // row_off[n_rb]
    const int *tile_ptr;  // n_rb + 1
    unsigned char *kind;  // tile_ptr[n_rb]
    int *bitmap_idx;      // tile_ptr[n_rb]
    unsigned *bitmaps;    // tile_ptr[n_rb] * block_m * bwpr, zeroed
    unsigned long long *n_partial; // slots taken (zeroed)
};
static_assert(sizeof(stof_mb_rw) == 96, "stof_mb_rw layout (mask_build.c)");

__device__ __forceinline__ int mb_rw_row(int f, int seq_q, int group)
{
    if (group <= 1)
        return f;
    for (int r = 0; r < group; r++) {
        const int n = r < seq_q ? (seq_q - r + group - 1) / group : 0;
        if (f < n)
            return r + group * f;
        f -= n;
    }
    return seq_q; // not reached for f < seq_q
}

// Grid (n_rb, ceil(n_words / 32)): 32 key words of row block i, each
// warp ORing every (MB_THREADS / 32)-th row, then combined; nk[i] (zeroed
// by the host) gathers the listed keys of every word chunk.
extern "C" __global__ void __launch_bounds__(MB_THREADS)
stof_mb_rw_or(const stof_mb_params P, const stof_mb_rw R)
{
    const int i = blockIdx.x, tid = threadIdx.x;
    const int lane = tid & 31, rg = tid >> 5;
    const int w = blockIdx.y * 32 + lane;
    const mb_seq s = mb_load_seq(P, 0);
    const int f0 = i * P.block_m;
    const int rows = P.seq_q - f0 < P.block_m ? P.seq_q - f0 : P.block_m;
    unsigned acc = 0;
    if (w < R.n_words)
        for (int r = rg; r < rows; r += MB_THREADS / 32) {
            const int q = mb_rw_row(f0 + r, P.seq_q, R.group);
            if (q < s.ql)
                acc |= mb_word(P, (stof_i64)q + s.off, (stof_i64)w * 32, s);
        }
    __shared__ unsigned s_or[MB_THREADS];
    s_or[tid] = acc;
    __syncthreads();
    if (rg != 0)
        return;
    for (int g = 1; g < MB_THREADS / 32; g++)
        acc |= s_or[g * 32 + lane];
    if (w < R.n_words)
        R.orw[(stof_i64)i * R.n_words + w] = acc;
    const int n = mb_warp_sum(w < R.n_words ? __popc(acc) : 0);
    if (lane == 0 && n)
        atomicAdd(R.nk + i, n);
}

extern "C" __global__ void __launch_bounds__(MB_THREADS)
stof_mb_rw_keys(const stof_mb_params P, const stof_mb_rw R)
{
    const int i = blockIdx.x, tid = threadIdx.x;
    const unsigned *orw = R.orw + (stof_i64)i * R.n_words;
    int *keys = R.keys + R.key_ptr[i];
    // The key list: the set bits of orw in order (a running prefix over
    // chunks of MB_THREADS words).
    __shared__ int s_wsum[MB_THREADS / 32];
    __shared__ int s_base;
    if (tid == 0)
        s_base = 0;
    __syncthreads();
    for (int w0 = 0; w0 < R.n_words; w0 += MB_THREADS) {
        const int w = w0 + tid;
        const unsigned x = w < R.n_words ? orw[w] : 0u;
        int c = __popc(x), incl = c;
        const int lane = tid & 31, warp = tid >> 5;
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o)
                incl += y;
        }
        if (lane == 31)
            s_wsum[warp] = incl;
        __syncthreads();
        int before = s_base;
        for (int k = 0; k < warp; k++)
            before += s_wsum[k];
        int at = before + incl - c;
        for (unsigned y = x; y; y &= y - 1)
            keys[at++] = w * 32 + __ffs((int)y) - 1;
        __syncthreads();
        if (tid == MB_THREADS - 1)
            s_base = before + incl;
        __syncthreads();
    }
}

// Grid (n_rb, ceil(rows * W / MB_THREADS)): each row's bits over its
// block's listed keys (W words a row), a word a thread.
extern "C" __global__ void __launch_bounds__(MB_THREADS)
stof_mb_rw_bits(const stof_mb_params P, const stof_mb_rw R)
{
    const int i = blockIdx.x, tid = threadIdx.x;
    const mb_seq s = mb_load_seq(P, 0);
    const int f0 = i * P.block_m;
    const int rows = P.seq_q - f0 < P.block_m ? P.seq_q - f0 : P.block_m;
    const int *keys = R.keys + R.key_ptr[i];
    const int nk = R.key_ptr[i + 1] - R.key_ptr[i];
    const int W = (nk + 31) / 32;
    unsigned *rb = R.row_bits + R.row_off[i];
    const int e = blockIdx.y * MB_THREADS + tid;
    if (e >= rows * W)
        return;
    const int r = e / W, o = e % W;
    const int q = mb_rw_row(f0 + r, P.seq_q, R.group);
    unsigned x = 0;
    if (q < s.ql) {
        const stof_i64 pos = (stof_i64)q + s.off;
        int last = -1;
        unsigned word = 0;
        const int nb = nk - 32 * o < 32 ? nk - 32 * o : 32;
        for (int b = 0; b < nb; b++) {
            const int k = keys[32 * o + b];
            if ((k >> 5) != last) {
                last = k >> 5;
                word = mb_word(P, pos, (stof_i64)last * 32, s);
            }
            x |= ((word >> (k & 31)) & 1u) << b;
        }
    }
    rb[(stof_i64)r * W + o] = x;
}

// Grid (n_rb): the tiles of block_n listed keys of row block i.
extern "C" __global__ void __launch_bounds__(MB_THREADS)
stof_mb_rw_tiles(const stof_mb_params P, const stof_mb_rw R)
{
    const int i = blockIdx.x, tid = threadIdx.x;
    const int f0 = i * P.block_m;
    const int rows = P.seq_q - f0 < P.block_m ? P.seq_q - f0 : P.block_m;
    const int nk = R.key_ptr[i + 1] - R.key_ptr[i];
    const int W = (nk + 31) / 32;
    const unsigned *rb = R.row_bits + R.row_off[i];
    // Tiles of block_n listed keys (block_n a multiple of 32), a warp
    // each: full when every listed key of every row is set; a partial
    // tile's bitmap goes to the next pool slot.
    const int bwpr = P.bwpr, nt = R.tile_ptr[i + 1] - R.tile_ptr[i];
    const int lane = tid & 31, nwarp = MB_THREADS / 32;
    const int tw = rows * bwpr; // the tile's words
    for (int t = tid >> 5; t < nt; t += nwarp) {
        const int cnt = nk - t * P.block_n < P.block_n ? nk - t * P.block_n
                                                       : P.block_n;
        int full = 1;
        for (int x = lane; x < tw; x += 32) {
            const int r = x / bwpr, j = x - r * bwpr;
            const int vb = cnt - 32 * j;
            const unsigned need =
                vb >= 32 ? ~0u : (vb > 0 ? (1u << vb) - 1u : 0u);
            const unsigned v =
                vb > 0 ? rb[(stof_i64)r * W + t * bwpr + j] : 0u;
            full &= (v & need) == need;
        }
        full = __all_sync(0xffffffffu, full);
        const int e = R.tile_ptr[i] + t;
        int slot = -1;
        if (lane == 0) {
            R.kind[e] = (unsigned char)(full ? MB_FULL : MB_PARTIAL);
            if (!full)
                slot = (int)atomicAdd(R.n_partial, 1ull);
            R.bitmap_idx[e] = slot;
        }
        slot = __shfl_sync(0xffffffffu, slot, 0);
        if (slot < 0)
            continue;
        unsigned *dst = R.bitmaps + (stof_i64)slot * P.block_m * bwpr;
        for (int x = lane; x < tw; x += 32) {
            const int r = x / bwpr, j = x - r * bwpr;
            const int vb = cnt - 32 * j;
            dst[x] = vb > 0 ? rb[(stof_i64)r * W + t * bwpr + j] &
                                  (vb >= 32 ? ~0u : (1u << vb) - 1u)
                            : 0u;
        }
    }
}
