// attn_block.cu - block-wise sparse attention, FlashAttention-2 style.
//
// One CTA computes BLOCK_M query rows of one (batch, head): grid.x =
// n_row_blocks of the format times batch * heads, CTA x the row block x %
// n_row_blocks of sequence x / n_row_blocks = b * heads + h
// (stof_cta_rb_bh); WARPS * 32 threads.
// It walks only the non-empty BLOCK_M x BLOCK_N tiles of its row block, as
// listed by the tile-level BSR of a stof_format built with the same
// BLOCK_M/BLOCK_N (see stof_format in stof.h):
//   FULL tiles    no mask at all, except that columns >= seq_k of the last
//                 key block are -inf;
//   PARTIAL tiles the tile's BLOCK_M x BLOCK_N bitmap (word c/32, bit c%32 of
//                 row r) sets the masked scores to -inf.
// With GATHER=1 the CTA walks the row-wise format instead (see "Gather
// mode" below).
// Softmax is online, in the exp2 domain (scale*log2(e) folded into the
// scores). A row that has seen no allowed key keeps m = -inf and the
// exponent offset used for it is 0 ("safe max"), so nothing becomes NaN; at
// the end O/l with l == 0 gives exact zeros.
//
// Compile-time parameters (-D):
//   HEAD_DIM  32, 64, 128 or 256         DTYPE  0 fp16, 1 bf16
//   BLOCK_M   64 or 128 (query rows per CTA)
//   BLOCK_N   32, 64 or 128 (keys per tile)
//   WARPS     4 or 8; each warp owns BLOCK_M/WARPS rows, a multiple of 16
//   STAGES    1..3: K/V tiles in flight (see "Pipeline" below)
//   Q_IN_REGS 0/1: keep the Q fragments in registers for the whole loop
//             (default: 1 when a warp's Q fits in 32 registers)
//   MIN_BLOCKS  __launch_bounds__ minimum CTAs per SM (default 1)
//   GATHER    0/1: block-wise tiles (0, default) or gathered row-wise
//             tiles (1)
//   SPLIT     0/1: split-KV (attn_split.cuh): gridDim.z = n_split CTAs
//             share a row block's tiles and write partial results that
//             stof_attn_combine (in the same module) merges
//   SOFTCAP   0/1: scores s = scale * q.k become softcap * tanh(s /
//             softcap) (cap_in, cap_out; stof_score_l2 in stof_common.cuh)
//   ALIBI     0/1: plus alibi[h] * (key - query row) (block mode only: the
//             gathered keys' indices are not at hand)
//   BIAS      0/1: plus the additive bias tensor's element (after the
//             mask; keys at or past seq_k read nothing; -inf masks;
//             block mode)
//   STOF_BLOCK_CHECKS  1: trap on inconsistent launch data (debugging)
//
// Shared memory (dynamic; bytes, in this order, see stof__block_smem_bytes
// in src/attn_block.c, which must compute the same total):
//   sQ   BLOCK_M x HEAD_DIM 16-bit, swizzled (reused to stage O at the end)
//   sK   STAGES x BLOCK_N x HEAD_DIM, swizzled
//   sV   STAGES x BLOCK_N x HEAD_DIM, swizzled
//   sB   STAGES x BLOCK_M x BLOCK_N/32 words: the partial tiles' bitmaps
//   meta STAGES x {key block, kind} ints, padded to 16 bytes
//   sI   (GATHER only) (STAGES+1) x 2 x BLOCK_N u32: row offsets of tiles
// Swizzle: a row of HEAD_DIM elements is HEAD_DIM/8 16-byte chunks; chunk c
// of row r is stored at chunk c ^ SW(r), SW(r) = r & 7 (rows of >= 128
// bytes) or (r >> 1) & 3 (HEAD_DIM 32: 64-byte rows, two per 128 bytes).
// Eight consecutive rows at one logical chunk then hit eight different
// 16-byte bank groups: ldmatrix and the 16-byte cp.async stores are
// conflict-free.
//
// Pipeline (cp.async groups, committed strictly in the order
// Q, K0, V0, K1, V1, ...; empty groups keep the count uniform at the tail):
//   prologue: Q, K0, V0, ..., K(S-2), V(S-2), K(S-1)      (S = STAGES)
//   tile t:   wait K(t); sync; issue V(t+S-1); S = Q K(t)^T; mask; softmax
//             wait V(t); sync; issue K(t+S);   O += P V(t)
// so at every wait exactly 2S-2 younger groups may stay in flight. With
// STAGES=1 this is FlashAttention-2's schedule (V(t) loads under Q K^T, K(t+1)
// under P V); each extra stage adds one tile of look-ahead. A partial
// tile's bitmap travels in K's group into the stage's sB slot.
//
// Gather mode (GATHER=1): the CTA's keys are its row block's compacted key
// list (rw_keys of the format: ascending, a key listed when any row of the
// block allows it), and its tile t is list entries t*BLOCK_N .. t*BLOCK_N +
// BLOCK_N - 1. K and V rows are copied by key index into the same dense,
// swizzled tiles, so the loop above runs unchanged over the compacted key
// sequence; entries past the list's end are zero-filled and masked.
// The host (stof__rowwise_format_upload) repacks the row-wise bitmaps per
// compacted tile (BLOCK_M rows x BLOCK_N/32 words, as block mode) and marks
// a tile FULL when every row of the block that exists allows every listed
// key of the tile; full tiles skip the bitmap as in block mode.
// QPERM: with q_rows set (a launch argument of the gather kernel), row r of
// the format is query row q_rows[r] of the tensors, for the Q loads and the
// O stores. The host builds the format on a mask whose rows were grouped
// (stof__mask_group_rows: for dilated:W:D, by residue class mod D), so a
// row block lists only the keys of its class: half the tiles for D = 2.
// Key indices travel through shared memory: sI is a ring of STAGES+1
// slots, tile u in slot u % (STAGES+1); a slot holds, per tile row, the
// K and the V row offset (key * seq stride, in 16-byte units, 0 past the
// list's end: the host guarantees they fit 32 bits). Threads tid < BLOCK_N
// read the keys of tile t+STAGES+1 from global at the start of iteration t
// and store the offsets at its end, into the slot of tile t (free by then:
// K(t) and V(t) were issued earlier, and a barrier separates their issue
// from the store). K(t+S) and V(t+S-1) are issued in iteration t from sI
// after a barrier, so the index latency stays off the critical path, and a
// loader thread spends one shared load and one multiply-add per row (all
// loads before the first cp.async: its memory clobber would otherwise
// serialise them, which cost 10-40% of the loop).
// Measured (H200, fp16, 2026-11-21, stof-bench-kernels): on the same tiles
// gather runs within -2..+3% of block mode; strided:128 at 4x16x4096x64 and
// 1x32x8192x128 took 0.137 / 0.244 ms (block best 0.420 / 1.126).
//
// Fragments (mma.sync m16n8k16, g = lane/4, q = lane%4):
//   A (Q, P): a0 (row g, k 2q..2q+1), a1 (row g+8), a2 (k+8), a3 (row g+8, k+8)
//   B (K^T, V): b0 (k 2q..2q+1, col g), b1 (k+8)
//   C: c0,c1 (row g, cols 2q, 2q+1), c2,c3 (row g+8)
//   Q: ldmatrix.x4 (rows 0-15 x k 0-7 | k 8-15) -> a0..a3
//   K: ldmatrix.x4 non-transposed on K rows (= B columns): two n8 tiles
//   V: ldmatrix.x4.trans on V rows (= B k-rows): two n8 tiles of head_dim
//   P: the S accumulators of n-tiles 2k, 2k+1 packed in pairs are exactly
//      the A fragment of k-step k, so P never leaves the registers.
//
// Tuning notes (H200, 4x16x4096x4096, fp16, dense): 4 warps owning 32 rows
// each (BLOCK_M=128, WARPS=4) beat 8 warps of 16 rows: every K/V ldmatrix
// then feeds twice the mma's (d=128: BLOCK_N=32, STAGES=2 reached ~300
// TFLOP/s; d=64: BLOCK_N=64 ~280). Configurations whose accumulators
// exceed 176 registers a thread spill and are refused by
// stof__block_cfg_valid.
//
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0,BLOCK_M=128,BLOCK_N=64,WARPS=8,STAGES=2 | HEAD_DIM=64,DTYPE=1,BLOCK_M=128,BLOCK_N=64,WARPS=8,STAGES=2
// STOF_VARIANTS: HEAD_DIM=128,DTYPE=0,BLOCK_M=128,BLOCK_N=64,WARPS=8,STAGES=2 | HEAD_DIM=128,DTYPE=1,BLOCK_M=128,BLOCK_N=64,WARPS=8,STAGES=2
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0,BLOCK_M=64,BLOCK_N=128,WARPS=4,STAGES=3 | HEAD_DIM=128,DTYPE=1,BLOCK_M=64,BLOCK_N=128,WARPS=4,STAGES=3
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0,BLOCK_M=64,BLOCK_N=32,WARPS=4,STAGES=2 | HEAD_DIM=128,DTYPE=1,BLOCK_M=128,BLOCK_N=32,WARPS=8,STAGES=3
// STOF_VARIANTS: HEAD_DIM=128,DTYPE=0,BLOCK_M=128,BLOCK_N=32,WARPS=4,STAGES=1 | HEAD_DIM=64,DTYPE=1,BLOCK_M=128,BLOCK_N=64,WARPS=4,STAGES=2
// STOF_VARIANTS: HEAD_DIM=32,DTYPE=0,BLOCK_M=128,BLOCK_N=64,WARPS=8,STAGES=2 | HEAD_DIM=32,DTYPE=1,BLOCK_M=64,BLOCK_N=128,WARPS=4,STAGES=1
// STOF_VARIANTS: HEAD_DIM=256,DTYPE=0,BLOCK_M=64,BLOCK_N=32,WARPS=4,STAGES=1 | HEAD_DIM=256,DTYPE=1,BLOCK_M=128,BLOCK_N=64,WARPS=8,STAGES=2
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0,BLOCK_M=128,BLOCK_N=64,WARPS=8,STAGES=2,GATHER=1 | HEAD_DIM=128,DTYPE=1,BLOCK_M=64,BLOCK_N=128,WARPS=4,STAGES=3,GATHER=1
// STOF_VARIANTS: HEAD_DIM=32,DTYPE=0,BLOCK_M=128,BLOCK_N=64,WARPS=8,STAGES=1,GATHER=1 | HEAD_DIM=256,DTYPE=1,BLOCK_M=64,BLOCK_N=32,WARPS=4,STAGES=1,GATHER=1
// STOF_VARIANTS: HEAD_DIM=128,DTYPE=1,BLOCK_M=64,BLOCK_N=64,WARPS=4,STAGES=2,SPLIT=1 | HEAD_DIM=32,DTYPE=0,BLOCK_M=64,BLOCK_N=128,WARPS=4,STAGES=2,GATHER=1,SPLIT=1
// STOF_VARIANTS: HEAD_DIM=256,DTYPE=0,BLOCK_M=64,BLOCK_N=32,WARPS=4,STAGES=1,SPLIT=1
// STOF_VARIANTS: HEAD_DIM=128,DTYPE=1,BLOCK_M=128,BLOCK_N=64,WARPS=8,STAGES=2,SOFTCAP=1,ALIBI=1 | HEAD_DIM=64,DTYPE=0,BLOCK_M=64,BLOCK_N=128,WARPS=4,STAGES=3,GATHER=1,SOFTCAP=1
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0,BLOCK_M=128,BLOCK_N=64,WARPS=4,STAGES=2,BIAS=1 | HEAD_DIM=256,DTYPE=1,BLOCK_M=64,BLOCK_N=32,WARPS=4,STAGES=1,SPLIT=1,BIAS=1,ALIBI=1
#include "stof_common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef BLOCK_M
#define BLOCK_M 128
#endif
#ifndef BLOCK_N
#define BLOCK_N 64
#endif
#ifndef WARPS
#define WARPS 8
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
#ifndef STOF_BLOCK_CHECKS
#define STOF_BLOCK_CHECKS 0
#endif
#ifndef GATHER
#define GATHER 0
#endif
#ifndef SPLIT
#define SPLIT 0
#endif
#if SPLIT
#include "attn_split.cuh"
#endif

#define BK_THREADS (WARPS * 32)
#define BK_WM (BLOCK_M / WARPS)      // query rows per warp
#define BK_MT (BK_WM / 16)           // m16 tiles per warp
#define BK_NT (BLOCK_N / 8)          // n8 tiles of S per warp
#define BK_DT (HEAD_DIM / 8)         // n8 tiles of O per warp
#define BK_CPR (HEAD_DIM / 8)        // 16-byte chunks per smem row
#define BK_ROWB (HEAD_DIM * 2)       // bytes per smem row
#define BK_WPR (BLOCK_N / 32)        // bitmap words per tile row

#ifndef Q_IN_REGS
#define Q_IN_REGS (BK_MT * HEAD_DIM <= 128)
#endif

#define BK_Q_BYTES (BLOCK_M * BK_ROWB)
#define BK_KV_BYTES (BLOCK_N * BK_ROWB)          // one stage of K (or V)
#define BK_BITS_BYTES (BLOCK_M * BK_WPR * 4)     // one stage of bitmap
#define BK_OFF_K (BK_Q_BYTES)
#define BK_OFF_V (BK_OFF_K + STAGES * BK_KV_BYTES)
#define BK_OFF_B (BK_OFF_V + STAGES * BK_KV_BYTES)
#define BK_OFF_META (BK_OFF_B + STAGES * BK_BITS_BYTES)
#define BK_OFF_IDX (BK_OFF_META + ((STAGES * 8 + 15) / 16) * 16)
#if GATHER
#define BK_IDX_BYTES ((STAGES + 1) * 2 * BLOCK_N * 4)
#else
#define BK_IDX_BYTES 0
#endif
#define BK_SMEM_BYTES (BK_OFF_IDX + BK_IDX_BYTES)

static_assert(HEAD_DIM == 32 || HEAD_DIM == 64 || HEAD_DIM == 128 ||
                  HEAD_DIM == 256,
              "HEAD_DIM must be 32, 64, 128 or 256");
static_assert(BLOCK_N == 32 || BLOCK_N == 64 || BLOCK_N == 128,
              "BLOCK_N must be 32, 64 or 128");
static_assert(BLOCK_M == 64 || BLOCK_M == 128, "BLOCK_M must be 64 or 128");
static_assert(WARPS == 4 || WARPS == 8, "WARPS must be 4 or 8");
static_assert(BLOCK_M % (16 * WARPS) == 0,
              "each warp must own a multiple of 16 query rows");
static_assert(STAGES >= 1 && STAGES <= 3, "STAGES must be 1..3");
static_assert(DTYPE == 0 || DTYPE == 1, "DTYPE must be 0 (fp16) or 1 (bf16)");
static_assert(GATHER == 0 || GATHER == 1, "GATHER must be 0 or 1");
static_assert(!(ALIBI && GATHER), "ALIBI needs block mode (key indices)");
static_assert(!(BIAS && GATHER), "BIAS needs block mode (key indices)");
static_assert(BLOCK_N <= BK_THREADS, "one key index per thread and tile");
static_assert((BK_BITS_BYTES % 16) == 0, "bitmap stage must be 16-byte chunks");

#define STOF_TILE_PARTIAL_ 1 // STOF_TILE_PARTIAL in stof.h

// The launch parameters, by value. Mirrored by stof_attn_block_params in
// src/attn_block.c; both sides check the size.
struct stof_attn_block_params {
    const unsigned short *q, *k, *v; // inputs (16-bit), 16-byte aligned
    unsigned short *o;               // output
    const int *row_ptr;          // n_row_blocks + 1: tiles of row block i are
                                 // entries row_ptr[i] .. row_ptr[i+1]-1 (of
                                 // batch b: from row_ptr + b * rp_stride)
    const int *col_idx;          // per tile: key block index (ascending)
    const unsigned char *kind;   // per tile: 1 partial, 2 full
    const int *bitmap_idx;       // per tile: index among partial tiles / -1
    const unsigned *bitmaps;     // per partial tile: BLOCK_M rows of
                                 // bitmap_words_per_row words
    stof_i64 q_stride[3], k_stride[3], v_stride[3], o_stride[3]; // b, h, seq
    int batch, heads, seq_q, seq_k;
    int n_row_blocks;
    int bitmap_words_per_row;    // must be BLOCK_N / 32
    float scale_log2;            // softmax scale * log2(e)
    int rp_stride;               // 0: one format for every batch element;
                                 // n_row_blocks: one per element (mask
                                 // families; block mode only);
                                 // -n_row_blocks: one per (element, head)
    int kv_group;                // query heads per K/V head (GQA), >= 1
    int pad_;
    float *lse;                  // NULL, or [batch][heads][seq_q]: each
                                 // row's log-sum-exp (natural log)
    float *o_part, *lse_part;    // SPLIT: the partials (attn_split.cuh)
    int n_split;                 // SPLIT: gridDim.z, >= 1
    float cap_in, cap_out;       // SOFTCAP: scale / softcap, softcap*log2(e)
    int pad2_;
    const float *alibi;          // ALIBI: [heads] slopes
    const unsigned short *bias;  // BIAS: element (b, h, row, key) at b *
    stof_i64 bias_stride[3];     // bias_stride[0] + h * [1] + row * [2] +
                                 // key (16-bit, the dtype)
    const int *k_lim;            // NULL, or [batch]: V rows of sequence b
                                 // at or past k_lim[b] are loaded as zeros
                                 // (padding may hold NaN: 0 x NaN is NaN)
#if GATHER
    // Gather mode: row_ptr, kind, bitmap_idx and bitmaps describe the
    // compacted tiles (row_ptr[i] .. row_ptr[i+1]-1 are row block i's), and
    // col_idx is unused. Row block i's keys are keys[key_ptr[i] ..
    // key_ptr[i+1]-1]. Mirrored by stof_attn_gather_params.
    const int *key_ptr;          // n_row_blocks + 1
    const int *keys;             // key indices (< seq_k), ascending per block
    const int *q_rows;           // NULL, or seq_q rows: row r of the format
                                 // is row q_rows[r] of q and o (QPERM)
#endif
};
static_assert(sizeof(stof_attn_block_params) ==
                  9 * 8 + 12 * 8 + 10 * 4 + 8 + 2 * 8 + 4 * 4 + 8 + 4 * 8 + 8 +
                      GATHER * 3 * 8,
              "stof_attn_block_params layout");

// ---------------------------------------------------------------------------
// PTX helpers
// ---------------------------------------------------------------------------

__device__ __forceinline__ void bk_ldsm_x4(unsigned r[4], unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ void bk_ldsm_x4_t(unsigned r[4], unsigned addr)
{
    asm volatile(
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
        : "r"(addr)
        : "memory");
}

__device__ __forceinline__ float bk_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x)); // ex2(-inf) = +0
    return y;
}

__device__ __forceinline__ int bk_ldg_i32(const int *p)
{
    int v;
    asm volatile("ld.global.nc.b32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ int bk_ldg_u8(const unsigned char *p)
{
    unsigned v;
    asm volatile("ld.global.nc.u8 %0, [%1];\n" : "=r"(v) : "l"(p));
    return (int)v;
}

// ---------------------------------------------------------------------------
// Swizzled shared-memory addressing
// ---------------------------------------------------------------------------

// The XOR applied to the chunk index of row r. Only bits 0..2 of r matter,
// so adding a multiple of 8 to r does not change it.
__device__ __forceinline__ int bk_sw(int r)
{
#if BK_CPR >= 8
    return r & 7;
#else
    return (r >> 1) & 3;
#endif
}

// Byte offset of chunk c of row r inside a swizzled tile.
__device__ __forceinline__ unsigned bk_off(int r, int c)
{
    return (unsigned)(r * BK_ROWB + ((c ^ bk_sw(r)) << 4));
}

// ldmatrix addressing, split into a per-lane part computed once and
// compile-time constants. A lane reads row R + lr, chunk C + lc, where R is
// a multiple of 8 and C is even (both compile-time after unrolling), lr is
// the lane's row (0..15) and lc its chunk parity (0/1). Then
//   bk_off(R + lr, C + lc) = bk_lane(lr, lc) ^ ((C & 7) << 4)
//                            + R * BK_ROWB + ((C & ~7) << 4)
// because sw(R + lr) = sw(lr), (C + lc) ^ x = (C & ~7) + ((C & 7) ^ lc ^ x)
// for x < 8, and lr * BK_ROWB has no bit where (C & 7) << 4 does. So each
// ldmatrix costs at most one XOR with an immediate.
__device__ __forceinline__ unsigned bk_lane(int lr, int lc)
{
    return (unsigned)(lr * BK_ROWB + ((lc ^ bk_sw(lr)) << 4));
}
#define BK_ADDR(lane_off, R, C)                                               \
    (((lane_off) ^ (unsigned)(((C) & 7) << 4)) +                              \
     (unsigned)((R) * BK_ROWB + (((C) & ~7) << 4)))

// ---------------------------------------------------------------------------
// Global -> shared tile loads (all threads take part; 16-byte cp.async)
// ---------------------------------------------------------------------------

// Copy `ROWS` rows of HEAD_DIM elements starting at global row `row0` of `g`
// (element stride `stride` between rows) into the swizzled tile at shared
// address `dst`. Rows >= `limit` are zero-filled without being read.
template <int ROWS>
__device__ __forceinline__ void bk_load_rows(unsigned dst,
                                             const unsigned short *g,
                                             stof_i64 stride, int row0,
                                             int limit, int tid)
{
    // Thread tid copies chunk tid % CPR of rows tid / CPR + i * RPP.
    constexpr int RPP = BK_THREADS / BK_CPR; // rows per pass
    constexpr int ITERS = (ROWS + RPP - 1) / RPP;
    const int r0 = tid / BK_CPR, c = tid % BK_CPR;
    const unsigned d0 = bk_off(r0, c);
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
        const int r = r0 + i * RPP;
        if (ROWS % RPP == 0 || r < ROWS) {
            const int gr = row0 + r;
            const bool ok = gr < limit;
            const unsigned short *src =
                g + (ok ? (stof_i64)gr * stride : (stof_i64)0) + c * 8;
            // RPP a multiple of 8: the swizzle of r equals that of r0.
            const unsigned d = RPP % 8 == 0 ? d0 + i * RPP * BK_ROWB
                                            : bk_off(r, c);
            stof_cp_async16(dst + d, src, ok ? 16 : 0);
        }
    }
}

#if GATHER
// Gather version of bk_load_rows: row r of the tile starts off[r] 16-byte
// units after g (off in shared memory); rows r >= lim are zero-filled
// without being read (their offset is 0, a valid address).
template <int ROWS>
__device__ __forceinline__ void bk_gather_rows(unsigned dst,
                                               const unsigned short *g,
                                               const unsigned *off, int lim,
                                               int tid)
{
    constexpr int RPP = BK_THREADS / BK_CPR; // rows per pass
    constexpr int ITERS = (ROWS + RPP - 1) / RPP;
    const int r0 = tid / BK_CPR, c = tid % BK_CPR;
    const unsigned d0 = bk_off(r0, c);
    const unsigned char *gc = (const unsigned char *)(g + c * 8);
    // All offsets first: the cp.async asm clobbers memory, so a shared load
    // after one would wait for it, serialising the rows.
    unsigned o[ITERS];
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
        const int r = r0 + i * RPP;
        o[i] = ROWS % RPP == 0 || r < ROWS ? off[r] : 0u;
    }
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
        const int r = r0 + i * RPP;
        if (ROWS % RPP == 0 || r < ROWS) {
            const unsigned char *src = gc + (stof_u64)o[i] * 16u;
            const unsigned d = RPP % 8 == 0 ? d0 + i * RPP * BK_ROWB
                                            : bk_off(r, c);
            stof_cp_async16(dst + d, src, r < lim ? 16 : 0);
        }
    }
}

// Q rows row0 .. row0 + ROWS - 1 of the format into the swizzled tile at
// `dst`, as bk_load_rows, but row gr of the format is tensor row
// rows[gr] when `rows` is not NULL (QPERM); rows >= limit are zero-filled.
// The row indices are all loaded (non-volatile, so batched) before the
// first copy.
template <int ROWS>
__device__ __forceinline__ void bk_load_qrows(unsigned dst,
                                              const unsigned short *g,
                                              stof_i64 stride, int row0,
                                              int limit, const int *rows,
                                              int tid)
{
    constexpr int RPP = BK_THREADS / BK_CPR; // rows per pass
    constexpr int ITERS = (ROWS + RPP - 1) / RPP;
    const int r0 = tid / BK_CPR, c = tid % BK_CPR;
    const unsigned d0 = bk_off(r0, c);
    int src[ITERS];
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
        const int r = r0 + i * RPP, gr = row0 + r;
        int x = -1;
        if ((ROWS % RPP == 0 || r < ROWS) && gr < limit) {
            if (rows)
                asm("ld.global.nc.b32 %0, [%1];\n" : "=r"(x) : "l"(rows + gr));
            else
                x = gr;
        }
        src[i] = x;
    }
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
        const int r = r0 + i * RPP;
        if (ROWS % RPP == 0 || r < ROWS) {
            const unsigned short *sp =
                g + (src[i] >= 0 ? (stof_i64)src[i] * stride : (stof_i64)0) +
                c * 8;
            const unsigned d = RPP % 8 == 0 ? d0 + i * RPP * BK_ROWB
                                            : bk_off(r, c);
            stof_cp_async16(dst + d, sp, src[i] >= 0 ? 16 : 0);
        }
    }
}

// Store the K and V row offsets of key `key` (-1: past the list's end) as
// row `j` of index slot `so` (2 * BLOCK_N words: K offsets, then V).
__device__ __forceinline__ void bk_idx_store(unsigned *so, int j, int key,
                                             stof_i64 k16, stof_i64 v16)
{
    so[j] = key >= 0 ? (unsigned)(key * k16) : 0u;
    so[BLOCK_N + j] = key >= 0 ? (unsigned)(key * v16) : 0u;
}

// The key index of entry `pos` of a CTA's compacted list, -1 past its end.
__device__ __forceinline__ int bk_key_at(const int *keys, int pos, int nk)
{
    return pos < nk ? bk_ldg_i32(keys + pos) : -1;
}
#endif

// Copy one partial tile's bitmap (BLOCK_M * BK_WPR contiguous words, the
// start 16-byte aligned because BLOCK_M * BK_WPR * 4 is a multiple of 256).
__device__ __forceinline__ void bk_load_bits(unsigned dst,
                                             const unsigned *bitmaps,
                                             int bidx, int tid)
{
    constexpr int CHUNKS = BK_BITS_BYTES / 16;
    const unsigned *src = bitmaps + (stof_i64)bidx * (BLOCK_M * BK_WPR);
#pragma unroll
    for (int i = 0; i < (CHUNKS + BK_THREADS - 1) / BK_THREADS; i++) {
        const int idx = tid + i * BK_THREADS;
        if (CHUNKS % BK_THREADS == 0 || idx < CHUNKS)
            stof_cp_async16(dst + idx * 16, src + idx * 4, 16);
    }
}

// ---------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(BK_THREADS, MIN_BLOCKS)
stof_attn_block(const stof_attn_block_params p)
{
    stof_grid_wait(); // programmatic dependent launch: see stof_common.cuh
    stof_grid_release();
    extern __shared__ __align__(128) unsigned char bk_smem[];

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3; // fragment row group / quad lane
    int rb, bh; // query row block, batch * heads + head
    stof_cta_rb_bh(p.n_row_blocks, rb, bh);
    const int b = bh / p.heads, h = bh - b * p.heads;
    const int q0 = rb * BLOCK_M;
    const int wrow = warp * BK_WM; // first row of this warp inside the block

    const unsigned short *qg = p.q + b * p.q_stride[0] + h * p.q_stride[1];
    const int hk = p.kv_group > 1 ? h / p.kv_group : h; // K/V head (GQA)
    const unsigned short *kg = p.k + b * p.k_stride[0] + hk * p.k_stride[1];
    const unsigned short *vg = p.v + b * p.v_stride[0] + hk * p.v_stride[1];
    unsigned short *og = p.o + b * p.o_stride[0] + h * p.o_stride[1];
#if !GATHER
    // V rows past the sequence's keys load as zeros: P is 0 there, but a
    // padding row holding NaN or Inf would make 0 x NaN = NaN in P V.
    const int v_lim =
        p.k_lim ? min(p.seq_k, max(0, bk_ldg_i32(p.k_lim + b))) : p.seq_k;
#endif

    const unsigned sQ = stof_smem_addr(bk_smem);
    const unsigned sK = sQ + BK_OFF_K;
    const unsigned sV = sQ + BK_OFF_V;
    const unsigned sB = sQ + BK_OFF_B;
    const unsigned *s_bits = (const unsigned *)(bk_smem + BK_OFF_B);
    int *s_meta = (int *)(bk_smem + BK_OFF_META); // [stage][2]: col, kind

    const int *rpb =
        p.row_ptr + (p.rp_stride >= 0
                         ? (stof_i64)b * p.rp_stride
                         : ((stof_i64)b * p.heads + h) * -(stof_i64)p.rp_stride);
    int e0 = bk_ldg_i32(rpb + rb);
    int n = bk_ldg_i32(rpb + rb + 1) - e0; // non-empty tiles
#if SPLIT
    int lo, hi; // split-KV: this CTA's share of the row block's tiles
    stof_split_range(n, p.n_split, lo, hi);
#else
    const int lo = 0, hi = n;
#endif
    e0 += lo;
    n = hi - lo;
#if GATHER
    unsigned *s_idx = (unsigned *)(bk_smem + BK_OFF_IDX); // [S+1][2][BN]
    const stof_i64 k16 = p.k_stride[2] >> 3, v16 = p.v_stride[2] >> 3;
    // Tile t of this CTA is list entries (lo + t) * BLOCK_N ..: the list
    // from there, at most n tiles of it.
    const int *keys = p.keys + bk_ldg_i32(p.key_ptr + rb) + lo * BLOCK_N;
    const int nk = max(0, min(bk_ldg_i32(p.key_ptr + rb + 1) -
                                  bk_ldg_i32(p.key_ptr + rb) - lo * BLOCK_N,
                              n * BLOCK_N)); // listed keys
#endif

#if STOF_BLOCK_CHECKS
    if (p.bitmap_words_per_row != BK_WPR || n < 0 || rb >= p.n_row_blocks ||
        bh >= p.batch * p.heads)
        __trap();
#if GATHER
    if (nk < 0 || n != (nk + BLOCK_N - 1) / BLOCK_N)
        __trap();
#endif
#endif

    // Running softmax state per fragment row (g and g+8 of each m16 tile),
    // in the log2 domain, and the O accumulators.
    float m_run[BK_MT][2], l_run[BK_MT][2];
    float oacc[BK_MT][BK_DT][4];
#pragma unroll
    for (int mt = 0; mt < BK_MT; mt++) {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            m_run[mt][hh] = STOF_NEG_INF;
            l_run[mt][hh] = 0.0f;
        }
#pragma unroll
        for (int dt = 0; dt < BK_DT; dt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                oacc[mt][dt][i] = 0.0f;
    }

    // Per-lane ldmatrix coordinates (rows relative to a multiple of 8, so
    // the swizzle depends on the lane only).
    //   Q (A, x4): row lane%16, chunk 2kk + lane/16
    //   K (B, x4): row lane%8 + 8*(lane/16), chunk 2kk + (lane/8)%2
    //   V (B, x4.trans): row lane%16, chunk 2dp + lane/16
    const unsigned q_lane = bk_lane(lane & 15, lane >> 4);
    const unsigned k_lane = bk_lane((lane & 7) + ((lane >> 4) << 3),
                                    (lane >> 3) & 1);
    const unsigned v_lane = bk_lane(lane & 15, lane >> 4);

#if Q_IN_REGS
    unsigned qf[BK_MT][HEAD_DIM / 16][4];
#endif

    if (n > 0) {
#if GATHER
        // Key indices of tiles 0..STAGES into ring slots 0..STAGES.
        if (tid < BLOCK_N) {
#pragma unroll
            for (int s = 0; s <= STAGES; s++)
                if (s < n)
                    bk_idx_store(s_idx + s * 2 * BLOCK_N, tid,
                                 bk_key_at(keys, s * BLOCK_N + tid, nk), k16,
                                 v16);
        }
        __syncthreads();
#endif
        // ---- prologue: Q, K0, V0, ..., K(S-2), V(S-2), K(S-1) -------------
#if GATHER
        bk_load_qrows<BLOCK_M>(sQ, qg, p.q_stride[2], q0, p.seq_q, p.q_rows,
                               tid);
#else
        bk_load_rows<BLOCK_M>(sQ, qg, p.q_stride[2], q0, p.seq_q, tid);
#endif
        stof_cp_commit();
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            if (s < n) {
#if GATHER
                const int col = 0; // unused: the indices are in sI
                const int kind = bk_ldg_u8(p.kind + e0 + s);
                bk_gather_rows<BLOCK_N>(sK + s * BK_KV_BYTES, kg,
                                        s_idx + s * 2 * BLOCK_N,
                                        nk - s * BLOCK_N, tid);
#else
                const int col = bk_ldg_i32(p.col_idx + e0 + s);
                const int kind = bk_ldg_u8(p.kind + e0 + s);
                bk_load_rows<BLOCK_N>(sK + s * BK_KV_BYTES, kg, p.k_stride[2],
                                      col * BLOCK_N, p.seq_k, tid);
#endif
                if (kind == STOF_TILE_PARTIAL_)
                    bk_load_bits(sB + s * BK_BITS_BYTES, p.bitmaps,
                                 bk_ldg_i32(p.bitmap_idx + e0 + s), tid);
                if (tid == 0) {
                    s_meta[2 * s] = col;
                    s_meta[2 * s + 1] = kind;
                }
            }
            stof_cp_commit();
            if (s < STAGES - 1) {
                if (s < n) {
#if GATHER
                    bk_gather_rows<BLOCK_N>(sV + s * BK_KV_BYTES, vg,
                                            s_idx + (2 * s + 1) * BLOCK_N,
                                            nk - s * BLOCK_N, tid);
#else
                    const int col = bk_ldg_i32(p.col_idx + e0 + s);
                    bk_load_rows<BLOCK_N>(sV + s * BK_KV_BYTES, vg,
                                          p.v_stride[2], col * BLOCK_N,
                                          v_lim, tid);
#endif
                }
                stof_cp_commit();
            }
        }
#if Q_IN_REGS
        // Q is the oldest group: 2S-1 younger ones may stay in flight.
        stof_cp_wait<2 * STAGES - 1>();
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < BK_MT; mt++)
#pragma unroll
            for (int kk = 0; kk < HEAD_DIM / 16; kk++)
                bk_ldsm_x4(qf[mt][kk],
                           sQ + wrow * BK_ROWB +
                               BK_ADDR(q_lane, 16 * mt, 2 * kk));
#endif
    }

    // Metadata of the tile whose K is issued next (tile t + STAGES),
    // prefetched one iteration ahead.
    int nk_col = 0, nk_kind = 0, nk_bidx = 0;
    if (STAGES < n) {
#if !GATHER
        nk_col = bk_ldg_i32(p.col_idx + e0 + STAGES);
#endif
        nk_kind = bk_ldg_u8(p.kind + e0 + STAGES);
        nk_bidx = bk_ldg_i32(p.bitmap_idx + e0 + STAGES);
    }

    const float sl2 = p.scale_log2;
#if ALIBI
    const float slope_l2 = p.alibi[h] * STOF_LOG2E;
#else
    const float slope_l2 = 0.0f;
#endif
#if BIAS
    // The bias row of this thread's fragment row g of m-tile 0; rows 16 mt
    // + 8 hh further are bias_stride[2] apart.
    const int bias_r0 = q0 + wrow + g;
    const unsigned short *bias_g = p.bias + b * p.bias_stride[0] +
                                   h * p.bias_stride[1] +
                                   (stof_i64)bias_r0 * p.bias_stride[2];
#endif
    int slot = 0; // t % STAGES
#if GATHER
    int islot = 0; // t % (STAGES + 1): tile t's slot in the index ring
#endif

    for (int t = 0; t < n; t++) {
        // Prefetch the metadata of tile t + STAGES + 1 (its K goes out in
        // the next iteration).
        int f_col = 0, f_kind = 0, f_bidx = 0;
#if GATHER
        int f_key = -1;
#endif
        if (t + STAGES + 1 < n) {
            const int e = e0 + t + STAGES + 1;
#if GATHER
            if (tid < BLOCK_N)
                f_key = bk_key_at(keys, (t + STAGES + 1) * BLOCK_N + tid, nk);
#else
            f_col = bk_ldg_i32(p.col_idx + e);
#endif
            f_kind = bk_ldg_u8(p.kind + e);
            f_bidx = bk_ldg_i32(p.bitmap_idx + e);
        }

        // ---- K(t) (and its bitmap) has landed; V(t-1) is free -----------
        stof_cp_wait<2 * STAGES - 2>();
        __syncthreads();
        {
            const int u = t + STAGES - 1;
            const int vs = slot + STAGES - 1 >= STAGES ? slot - 1 : slot + STAGES - 1;
#if GATHER
            // Tile u = t + S - 1 is in index slot (t + S - 1) % (S + 1).
            const int is = islot >= 2 ? islot - 2 : islot + STAGES - 1;
            if (u < n)
                bk_gather_rows<BLOCK_N>(sV + vs * BK_KV_BYTES, vg,
                                        s_idx + (2 * is + 1) * BLOCK_N,
                                        nk - u * BLOCK_N, tid);
#else
            if (u < n)
                bk_load_rows<BLOCK_N>(sV + vs * BK_KV_BYTES, vg, p.v_stride[2],
                                      s_meta[2 * vs] * BLOCK_N, v_lim, tid);
#endif
            stof_cp_commit();
        }
#if !GATHER
        const int col = s_meta[2 * slot];
#endif
        const int kind = s_meta[2 * slot + 1];

        // ---- S = Q K^T ----------------------------------------------------
        float sacc[BK_MT][BK_NT][4];
#pragma unroll
        for (int mt = 0; mt < BK_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < BK_NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    sacc[mt][nt][i] = 0.0f;

        const unsigned kt = sK + slot * BK_KV_BYTES;
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
            unsigned qa[BK_MT][4];
#pragma unroll
            for (int mt = 0; mt < BK_MT; mt++) {
#if Q_IN_REGS
#pragma unroll
                for (int i = 0; i < 4; i++)
                    qa[mt][i] = qf[mt][kk][i];
#else
                bk_ldsm_x4(qa[mt], sQ + wrow * BK_ROWB +
                                       BK_ADDR(q_lane, 16 * mt, 2 * kk));
#endif
            }
#pragma unroll
            for (int np = 0; np < BK_NT / 2; np++) {
                unsigned kb[4]; // b0,b1 of n-tile 2np; b0,b1 of n-tile 2np+1
                bk_ldsm_x4(kb, kt + BK_ADDR(k_lane, 16 * np, 2 * kk));
#pragma unroll
                for (int mt = 0; mt < BK_MT; mt++) {
                    stof_mma16816(sacc[mt][2 * np], qa[mt], kb[0], kb[1]);
                    stof_mma16816(sacc[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
                }
            }
        }

        // ---- scale (log2 domain) and mask --------------------------------
        // Element (mt, nt, i): row wrow + 16mt + g + 8*(i/2), column
        // 8nt + 2tq + (i%2) of the tile.
#if SOFTCAP || ALIBI
        {
            // Key - query row of element (mt, nt, i), block mode (ALIBI).
#if ALIBI
            const int dk0 = col * BLOCK_N + 2 * tq - (q0 + wrow + g);
#else
            const int dk0 = 0;
#endif
#pragma unroll
            for (int mt = 0; mt < BK_MT; mt++)
#pragma unroll
                for (int nt = 0; nt < BK_NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        sacc[mt][nt][i] = stof_score_l2(
                            sacc[mt][nt][i], sl2, p.cap_in, p.cap_out,
                            slope_l2,
                            dk0 + 8 * nt + (i & 1) - 16 * mt - 8 * (i >> 1));
        }
#else
        (void)slope_l2;
#pragma unroll
        for (int mt = 0; mt < BK_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < BK_NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    sacc[mt][nt][i] *= sl2;
#endif

        if (kind == STOF_TILE_PARTIAL_) {
            const unsigned *bits = s_bits + slot * (BLOCK_M * BK_WPR);
#pragma unroll
            for (int mt = 0; mt < BK_MT; mt++) {
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int r = wrow + 16 * mt + g + 8 * hh;
                    unsigned w[BK_WPR];
#pragma unroll
                    for (int j = 0; j < BK_WPR; j++)
                        w[j] = bits[r * BK_WPR + j] >> (2 * tq);
#pragma unroll
                    for (int nt = 0; nt < BK_NT; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            if (!((w[nt >> 2] >> (8 * (nt & 3) + e)) & 1u))
                                sacc[mt][nt][2 * hh + e] = STOF_NEG_INF;
                }
            }
        }
#if GATHER
        else if (t * BLOCK_N + BLOCK_N > nk) {
            // The last tile of the list: entries >= nk are -inf.
            const int lim = nk - t * BLOCK_N - 2 * tq;
#else
        else if (col * BLOCK_N + BLOCK_N > p.seq_k) {
            // A full tile hanging past seq_k: columns >= seq_k are -inf.
            const int lim = p.seq_k - col * BLOCK_N - 2 * tq;
#endif
#pragma unroll
            for (int mt = 0; mt < BK_MT; mt++)
#pragma unroll
                for (int nt = 0; nt < BK_NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        if (8 * nt + (i & 1) >= lim)
                            sacc[mt][nt][i] = STOF_NEG_INF;
        }
#if BIAS
        // The additive bias, after the mask (stof_bias_ld2: a row's loads
        // issue together).
        // Rows past seq_q read row seq_q - 1 (their scores are never
        // stored); a tile inside seq_k loads with immediate offsets.
#pragma unroll
        for (int mt = 0; mt < BK_MT; mt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int dr = 16 * mt + 8 * hh;
                const unsigned short *br =
                    bias_g + (stof_i64)(bias_r0 + dr < p.seq_q
                                            ? dr
                                            : p.seq_q - 1 - bias_r0) *
                                 p.bias_stride[2];
                const int c0 = col * BLOCK_N + 2 * tq;
                unsigned u[BK_NT];
                if (col * BLOCK_N + BLOCK_N <= p.seq_k) {
#pragma unroll
                    for (int nt = 0; nt < BK_NT; nt++)
                        u[nt] = stof_bias_ld2_full(br + c0 + 8 * nt);
                } else {
#pragma unroll
                    for (int nt = 0; nt < BK_NT; nt++)
                        u[nt] = stof_bias_ld2(br, c0 + 8 * nt,
                                              p.seq_k - c0 - 8 * nt);
                }
#pragma unroll
                for (int nt = 0; nt < BK_NT; nt++)
                    stof_bias_add2(u[nt], sacc[mt][nt][2 * hh],
                                   sacc[mt][nt][2 * hh + 1], STOF_LOG2E);
            }
#endif

        // ---- online softmax ----------------------------------------------
#pragma unroll
        for (int mt = 0; mt < BK_MT; mt++) {
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                float mx = m_run[mt][hh];
#pragma unroll
                for (int nt = 0; nt < BK_NT; nt++) {
                    mx = fmaxf(mx, sacc[mt][nt][2 * hh]);
                    mx = fmaxf(mx, sacc[mt][nt][2 * hh + 1]);
                }
                // The four lanes of a quad hold the same row.
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                // Safe max: a row with no allowed key so far keeps
                // m = -inf but subtracts 0, so exp2 gives 0, never NaN.
                const float mu = mx == STOF_NEG_INF ? 0.0f : mx;
                const float alpha = bk_exp2(m_run[mt][hh] - mu);
                m_run[mt][hh] = mx;
                float rs = 0.0f;
#pragma unroll
                for (int nt = 0; nt < BK_NT; nt++) {
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float pe = bk_exp2(sacc[mt][nt][2 * hh + e] - mu);
                        sacc[mt][nt][2 * hh + e] = pe;
                        rs += pe;
                    }
                }
                l_run[mt][hh] = l_run[mt][hh] * alpha + rs; // partial (quad)
#pragma unroll
                for (int dt = 0; dt < BK_DT; dt++) {
                    oacc[mt][dt][2 * hh] *= alpha;
                    oacc[mt][dt][2 * hh + 1] *= alpha;
                }
            }
        }

        // ---- V(t) has landed; every warp is done with K(t) ---------------
        stof_cp_wait<2 * STAGES - 2>();
        __syncthreads();
        {
            if (t + STAGES < n) {
#if GATHER
                // Tile t + S is in index slot (t + S) % (S + 1).
                const int is = islot == 0 ? STAGES : islot - 1;
                bk_gather_rows<BLOCK_N>(sK + slot * BK_KV_BYTES, kg,
                                        s_idx + 2 * is * BLOCK_N,
                                        nk - (t + STAGES) * BLOCK_N, tid);
#else
                bk_load_rows<BLOCK_N>(sK + slot * BK_KV_BYTES, kg,
                                      p.k_stride[2], nk_col * BLOCK_N,
                                      p.seq_k, tid);
#endif
                if (nk_kind == STOF_TILE_PARTIAL_)
                    bk_load_bits(sB + slot * BK_BITS_BYTES, p.bitmaps, nk_bidx,
                                 tid);
                if (tid == 0) {
                    s_meta[2 * slot] = nk_col;
                    s_meta[2 * slot + 1] = nk_kind;
                }
            }
            stof_cp_commit();
        }

        // ---- O += P V(t) -------------------------------------------------
        const unsigned vt = sV + slot * BK_KV_BYTES;
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; kk++) {
            unsigned pa[BK_MT][4];
#pragma unroll
            for (int mt = 0; mt < BK_MT; mt++) {
                pa[mt][0] = stof_pack2(sacc[mt][2 * kk][0], sacc[mt][2 * kk][1]);
                pa[mt][1] = stof_pack2(sacc[mt][2 * kk][2], sacc[mt][2 * kk][3]);
                pa[mt][2] =
                    stof_pack2(sacc[mt][2 * kk + 1][0], sacc[mt][2 * kk + 1][1]);
                pa[mt][3] =
                    stof_pack2(sacc[mt][2 * kk + 1][2], sacc[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < HEAD_DIM / 16; dp++) {
                unsigned vb[4]; // b0,b1 of d-tile 2dp; b0,b1 of d-tile 2dp+1
                bk_ldsm_x4_t(vb, vt + BK_ADDR(v_lane, 16 * kk, 2 * dp));
#pragma unroll
                for (int mt = 0; mt < BK_MT; mt++) {
                    stof_mma16816(oacc[mt][2 * dp], pa[mt], vb[0], vb[1]);
                    stof_mma16816(oacc[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
                }
            }
        }

        nk_col = f_col;
        nk_kind = f_kind;
        nk_bidx = f_bidx;
        slot = slot + 1 == STAGES ? 0 : slot + 1;
#if GATHER
        // Tile t + S + 1 takes tile t's index slot: K(t) and V(t) were
        // issued before this iteration's second barrier.
        if (tid < BLOCK_N && t + STAGES + 1 < n)
            bk_idx_store(s_idx + islot * 2 * BLOCK_N, tid, f_key, k16, v16);
        islot = islot == STAGES ? 0 : islot + 1;
#endif
    }

    // ---- epilogue: O / l, staged through this warp's own sQ rows ----------
    // Only this warp ever reads its sQ rows, and every cp.async that wrote
    // them completed before the first tile (none was issued when n == 0).
#pragma unroll
    for (int mt = 0; mt < BK_MT; mt++) {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float l = l_run[mt][hh];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int gr = q0 + wrow + 16 * mt + g + 8 * hh;
#if SPLIT
            float *lse_out = p.lse_part + (stof_i64)blockIdx.z *
                                              p.batch * p.heads * p.seq_q;
#else
            float *lse_out = p.lse;
#endif
            if (lse_out && tq == 0 && gr < p.seq_q) {
                // m_run is the row's max in log2 units (scores * sl2).
#if GATHER
                const int orow = p.q_rows ? p.q_rows[gr] : gr;
#else
                const int orow = gr;
#endif
                lse_out[((stof_i64)b * p.heads + h) * p.seq_q + orow] =
                    l > 0.0f ? (m_run[mt][hh] + log2f(l)) * 0.69314718f
                             : STOF_NEG_INF;
            }
            l_run[mt][hh] = l > 0.0f ? 1.0f / l : 0.0f; // 0 keys -> zeros
        }
    }
#if SPLIT
    // Split-KV: every thread stores its own fragments of O / l in fp32 and
    // stof_attn_combine writes the output.
    {
        const stof_i64 bh_rows = (stof_i64)p.batch * p.heads * p.seq_q;
#pragma unroll
        for (int mt = 0; mt < BK_MT; mt++) {
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int gr = q0 + wrow + 16 * mt + g + 8 * hh;
                if (gr >= p.seq_q)
                    continue;
#if GATHER
                const int orow = p.q_rows ? p.q_rows[gr] : gr;
#else
                const int orow = gr;
#endif
                const stof_i64 row = (stof_i64)bh * p.seq_q + orow;
                const float inv = l_run[mt][hh];
#pragma unroll
                for (int dt = 0; dt < BK_DT; dt++)
                    stof_split_store2(p.o_part, blockIdx.z, bh_rows, row,
                                      8 * dt + 2 * tq,
                                      oacc[mt][dt][2 * hh] * inv,
                                      oacc[mt][dt][2 * hh + 1] * inv);
            }
        }
        return;
    }
#endif
    __syncwarp();
    unsigned char *sq_bytes = bk_smem;
#pragma unroll
    for (int mt = 0; mt < BK_MT; mt++) {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int r = wrow + 16 * mt + g + 8 * hh;
            const float inv = l_run[mt][hh];
#pragma unroll
            for (int dt = 0; dt < BK_DT; dt++) {
                const unsigned v2 = stof_pack2(oacc[mt][dt][2 * hh] * inv,
                                             oacc[mt][dt][2 * hh + 1] * inv);
                *(unsigned *)(sq_bytes + bk_off(r, dt) + 4 * tq) = v2;
            }
        }
    }
    __syncwarp();
    constexpr int OUT_CHUNKS = BK_WM * BK_CPR;
#pragma unroll
    for (int i = 0; i < (OUT_CHUNKS + 31) / 32; i++) {
        const int idx = lane + 32 * i;
        if (OUT_CHUNKS % 32 == 0 || idx < OUT_CHUNKS) {
            const int r = wrow + idx / BK_CPR, c = idx % BK_CPR;
            const int gr = q0 + r;
            if (gr < p.seq_q) {
                const uint4 v4 = *(const uint4 *)(sq_bytes + bk_off(r, c));
#if GATHER
                int orow = gr;
                if (p.q_rows)
                    asm("ld.global.nc.b32 %0, [%1];\n"
                        : "=r"(orow)
                        : "l"(p.q_rows + gr));
#else
                const int orow = gr;
#endif
                *(uint4 *)(og + (stof_i64)orow * p.o_stride[2] + c * 8) = v4;
            }
        }
    }
}
