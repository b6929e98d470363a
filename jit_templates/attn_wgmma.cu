// attn_wgmma.cu - block-wise sparse attention for sm_90a (Hopper):
// warp-specialised, TMA loads, wgmma for both GEMMs. STOF_NEEDS_SM90A
//
// Same problem and semantics as the block mode of attn_block.cu: one CTA
// computes the BLOCK_M (128, or 64) query rows of row block rb of one
// (batch, head) and walks only the non-empty BLOCK_M x BLOCK_N tiles of that
// row block (row_ptr / col_idx / kind / bitmap_idx / bitmaps of a
// stof_format built with this BLOCK_M and BLOCK_N):
//   FULL tiles    no mask, except columns >= seq_k of the last key block;
//   PARTIAL tiles the tile's bitmap (word c/32, bit c%32 of row r) masks.
// Rows without any allowed key produce exact zeros. grid.x = row blocks x
// batch * heads (stof_cta_rb_bh: CTA x is sequence-head x / n_row_blocks =
// b * heads + h and position x % n_row_blocks, whose row block is
// row_order[it] when row_order is not NULL, so the host can start the
// heavy row blocks first).
//
// Roles (BLOCK_M 128: 384 threads = 3 warpgroups, __launch_bounds__(384,
// 1); BLOCK_M 64: 256 threads = 2 warpgroups, __launch_bounds__(256, 2)):
//   warpgroup 0   producer: one thread issues every load (setmaxnreg.dec
//                 gives the registers to the consumers); in gather mode all
//                 128 threads issue cp.async (see "Gather mode" below);
//   warpgroups 1.. consumers: warpgroup 1 + c owns query rows 64c..64c+63
//                 of the block (one wgmma M = 64 each).
// BLOCK_M 192 (head_dim 64, block mode; 512 threads = 4 warpgroups,
// __launch_bounds__(512, 1)): three consumer warpgroups, so that two run
// their GEMMs while the third runs its softmax (FlashAttention-3's tile
// for head_dim 64). It reads a 64-row format (row block 3 rb's tiles for
// its row block rb; the host builds the format with BLOCK_M 64 and allows
// it only when every three consecutive row blocks list the same tiles,
// all FULL: dense masks), without row_order.
// BLOCK_M 64 is for masks whose structure is 64 rows fine (bigbird:64's
// blocks are exactly full 64 x 64 tiles; 128-row blocks union two block
// rows' columns): one consumer warpgroup, and two CTAs share an SM (at
// most 113 KB of shared memory each: d=64, or d=128 with BLOCK_N 64), so
// one CTA's prologue (Q and the first tiles from memory) and epilogue run
// under the other's wgmmas. At head_dim 64 with 64-key tiles three share
// an SM (80 registers a thread), four without OVERLAP at two stages (64;
// WG_OCC4): short rows wait mostly on their loads, and a fourth CTA's
// loads can hide more of that than the overlap inside one warpgroup does
// (H100, bench/RESULTS.md: 3-9% faster on the sparse masks at 512 and
// 2048 tokens; the search times both).
// Loads: Q once, then K(t) and V(t) of every tile t into STAGES slots, with
// cp.async.bulk.tensor (TMA, 4-D tensor maps over (head_dim, seq, heads,
// batch), built per launch on the host, 128-byte swizzle). Rows past seq_q /
// seq_k come in as zeros (the maps carry the real sizes), so any sequence
// length works; the key columns past seq_k are masked as in attn_block.cu.
// A partial tile's bitmap (BLOCK_M x BLOCK_N/32 words) travels with K, by a
// 1-D cp.async.bulk on the same mbarrier; the tile's {key block, kind} is
// stored into the slot's meta by the producer before it arms the barrier.
// mbarriers: Q (1 arrival + tx), fullK[s], fullV[s] (1 arrival + tx),
// emptyK[s], emptyV[s] (4 * BLOCK_M/64 arrivals: lane 0 of each consumer
// warp).
//
// Consumers (per warpgroup, FlashAttention-3 style):
//   S = Q K^T   wgmma m64 n BLOCK_N k16, A (Q) and B (K) from shared memory,
//               both K-major, 128-byte swizzle (SBO 1024 bytes);
//   mask, online softmax in registers (exp2 domain, scale folded into one
//               FFMA; "safe max": a row with no key so far subtracts 0, so
//               nothing becomes NaN, and O / l with l == 0 gives zeros);
//   O += P V    wgmma m64 n HEAD_DIM k16 with A = P from registers (the S
//               accumulators of n-tiles 2k, 2k+1 are exactly the A fragment
//               of k-step k) and B = V from shared memory, MN-major
//               (imm-trans-b = 1; LBO = the 64-column block stride,
//               SBO = 1024 bytes per 8 keys).
// OVERLAP = 1 (default) pipelines inside the warpgroup: iteration t issues
// S(t) = Q K(t)^T and then O += P(t-1) V(t-1), waits only for S(t), runs the
// softmax of tile t while the P V wgmma runs, then waits for it and rescales
// O. OVERLAP = 0 runs the two GEMMs back to back (simpler, for checking).
//
// Shared memory (dynamic; offsets from the first 1024-byte boundary, see
// stof__wgmma_smem_bytes in src/attn_wgmma.c, which adds the 1024 bytes of
// alignment slack):
//   sQ   BLOCK_M x HEAD_DIM: HEAD_DIM/64 column blocks of 128 rows x 128 B
//        (TMA / wgmma 128-byte swizzle: 16-byte chunk c of row r stored at
//        chunk c ^ (r & 7)); reused to stage O at the end (stmatrix),
//        whence one thread of each consumer warpgroup stores its 64 rows
//        by TMA (tm_o; gather mode: every thread, rows through q_rows)
//        (PERSIST: two such buffers, one per work item in turn)
//   sK   STAGES x (HEAD_DIM/64 column blocks of BLOCK_N rows x 128 B)
//   sV   the same
//   sB   STAGES x BLOCK_M x BLOCK_N/32 words (partial tiles' bitmaps)
//   item (PERSIST only) each Q buffer's work item, 2 x 16 bytes
//   bar  1 + 4*STAGES mbarriers (Q, fullK, fullV, emptyK, emptyV; PERSIST:
//        + the second Q buffer's full, both buffers' empty)
//   meta STAGES x {key block (gather: list tile), kind}
//   idx  (GATHER only) 2 slots x {K, V} x BLOCK_N u32 key row offsets
//
// Gather mode (GATHER=1): the CTA walks the row-wise format instead (the
// same device arrays as the mma.sync gather kernel, stof_rowwise_format
// uploaded with this BLOCK_M and BLOCK_N): row block rb's keys are the
// compacted list keys[key_ptr[rb] .. key_ptr[rb+1]-1] and its tile t is list
// entries t*BLOCK_N .. t*BLOCK_N + BLOCK_N-1, FULL or PARTIAL (bitmap
// repacked per compacted tile, BLOCK_M x BLOCK_N/32 words, as above). The
// TMA cannot gather rows, so every load is a 16-byte cp.async issued by all
// 128 producer threads (32 registers each, see WG_PRODUCER_REGS), written
// straight into the 128-byte-swizzled layout the wgmma descriptors read
// (chunk c of row r of a 64-column block at chunk c ^ (r & 7)); rows past
// the list's end (or seq_q) are zero-filled (src-size 0) and masked as the
// columns >= seq_k of block mode (the list length stands in for seq_k).
// Thread pt copies chunk pt % (HEAD_DIM/8) of rows pt / (HEAD_DIM/8) + i *
// (1024/HEAD_DIM): eight (sixteen) consecutive threads read one 128 (256)
// byte row, and a row's swizzle stays the same over i. Completion: each
// producer thread's cp.async.mbarrier.arrive.noinc on the stage's barrier
// (fullK: 128 of them + the arrival of thread 0 after it stored the meta;
// fullV and Q: 128), so a phase completes when all 128 threads' copies have
// landed; consumers run fence.proxy.async after the wait (cp.async writes in
// the generic proxy, wgmma reads in the async proxy). Key row offsets (key *
// seq stride, 16-byte units, 32 bits: the host checks they fit) travel
// through a 2-slot ring in shared memory: threads pt < BLOCK_N load tile
// t+1's key early in iteration t and store its K and V offsets at the end;
// a producer-only named barrier at the top of each iteration separates the
// stores from the reads. Q is always loaded by cp.async in gather mode
// (once per CTA), optionally permuted:
// q_rows (NULL or int32[seq_q]): row r of the format is query row q_rows[r]
// of the tensors, for the Q loads and the O stores (the host builds the
// format on a mask whose rows were grouped, e.g. by residue mod D for
// dilated masks, so each row block lists the keys of one class only).
// Measured (H200, fp16, 2026-11-21, stof-bench-wgmma, ms): dense
// 4x16x4096x64 gather 0.682 vs TMA block 0.615 (d=128 at 1x32x8192: 1.996
// vs 1.614: 16-byte cp.async moves K/V less efficiently than the TMA);
// dilated:512:2 with grouped rows 0.166 (BLOCK_M 64: 0.160; block mode
// 0.236), strided:128 0.158 (BLOCK_M 64: 0.121; block 0.515); at
// 1x32x8192x128 dilated grouped 0.236 / 0.233, strided 0.211 / 0.182.
// BLOCK_M 64 block mode on bigbird:64:3:2:3:1: 0.165 (4096, d=64) and
// 0.269 ms (8192, d=128), against 0.228 / 0.349 for the best 128-row cfg.
//
// Compile-time parameters (-D):
//   HEAD_DIM 64, 128 or 256 (256: BLOCK_M 128, BLOCK_N 64, STAGES 2, block
//            mode)    DTYPE 0 fp16, 1 bf16    BLOCK_N 64 or 128
//   STAGES   2..4 K/V slots    OVERLAP 0/1 (default 1)
//   GATHER   0 tile BSR + TMA (default), 1 row-wise lists + cp.async
//   BLOCK_M  128 (default), 64 or 192 (above) query rows per CTA
//   SPLIT    0/1: split-KV (attn_split.cuh): gridDim.z = n_split CTAs share
//            a row block's tiles and write partial results that
//            stof_attn_combine (in the same module) merges
//   SOFTCAP  0/1, ALIBI 0/1: score modifiers as in attn_block.cu (applied
//            to S before the mask; the softmax then runs with scale 1;
//            ALIBI in block mode only)
//   BIAS     0/1: plus the additive bias tensor (after the mask; block
//            mode only; without SOFTCAP / ALIBI the raw scores get bias /
//            scale and the softmax keeps its scale)
//   PERSIST  0/1: the persistent kernel (block mode, not SPLIT; see
//            "Persistent" below)
// Persistent (PERSIST=1): the grid is at most one CTA per SM slot
// (gridDim.x, gridDim.y = 1) and each CTA computes a share of the
// n_row_blocks * batch * heads work items one after the other (dealt in
// rounds, heavy row blocks first, see wg_sched). The producer loads
// the next item's Q and K/V tiles as soon as their buffers are free, so
// they arrive under the current item's last tiles and epilogue instead of
// after the CTA's start: Q alternates between two buffers (sQ, sQ +
// WG_Q_BYTES), each with a full barrier (the TMA, or a plain arrival for
// an item without tiles) and an empty one (each consumer warpgroup's
// storing thread, once the TMA store of the O staged there has read it,
// which it checks under the next item's first tile); the K/V slots and
// their phases run on across items. The producer alone walks the
// schedule: it stores each item's {b, h, q0, n} beside its Q buffer before
// arming the full barrier, and after the last item an item with n = -1,
// so the consumers start an item with no global loads of their own
// (reading the schedule and the row pointers themselves left two to four
// dependent loads exposed at each item's start: H200, ncu, 8 x 12 x 512 x
// 64 bigbird, 7% of the warps' samples; the tuned attention 1-4% faster
// without them, 2026-11-28). The static schedule suits problems of many
// similar row blocks (sliding windows, the public suite at 16k tokens);
// the search times it against the one-CTA-per-item grid.
// Built for sm_80 / sm_90 the kernel is a trap stub (no wgmma there).
//
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0,BLOCK_N=128,STAGES=2 | HEAD_DIM=64,DTYPE=1,BLOCK_N=128,STAGES=3
// STOF_VARIANTS: HEAD_DIM=128,DTYPE=0,BLOCK_N=128,STAGES=2 | HEAD_DIM=128,DTYPE=1,BLOCK_N=128,STAGES=2
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0,BLOCK_N=64,STAGES=4 | HEAD_DIM=128,DTYPE=1,BLOCK_N=64,STAGES=3
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=1,BLOCK_N=128,STAGES=2,OVERLAP=0 | HEAD_DIM=128,DTYPE=0,BLOCK_N=64,STAGES=2,OVERLAP=0
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0,BLOCK_N=128,STAGES=2,GATHER=1 | HEAD_DIM=128,DTYPE=1,BLOCK_N=128,STAGES=2,GATHER=1
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=1,BLOCK_N=64,STAGES=4,GATHER=1 | HEAD_DIM=128,DTYPE=0,BLOCK_N=64,STAGES=2,OVERLAP=0,GATHER=1
// STOF_VARIANTS: HEAD_DIM=128,DTYPE=1,BLOCK_N=128,STAGES=2,BLOCK_M=64,SPLIT=1 | HEAD_DIM=64,DTYPE=0,BLOCK_N=64,STAGES=3,GATHER=1,SPLIT=1
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0,BLOCK_M=64,BLOCK_N=64,STAGES=4 | HEAD_DIM=128,DTYPE=1,BLOCK_M=64,BLOCK_N=64,STAGES=2
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=1,BLOCK_M=64,BLOCK_N=128,STAGES=3 | HEAD_DIM=64,DTYPE=0,BLOCK_M=64,BLOCK_N=64,STAGES=3,GATHER=1 | HEAD_DIM=64,DTYPE=0,BLOCK_M=64,BLOCK_N=128,STAGES=2,OVERLAP=0
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=1,BLOCK_M=64,BLOCK_N=64,STAGES=2,SOFTCAP=1,BIAS=1 | HEAD_DIM=64,DTYPE=0,BLOCK_M=64,BLOCK_N=64,STAGES=3,GATHER=1,SPLIT=1
// STOF_VARIANTS: HEAD_DIM=128,DTYPE=1,BLOCK_N=128,STAGES=2,SOFTCAP=1,ALIBI=1 | HEAD_DIM=64,DTYPE=0,BLOCK_N=64,STAGES=3,BLOCK_M=64,OVERLAP=0,ALIBI=1 | HEAD_DIM=128,DTYPE=0,BLOCK_N=128,STAGES=2,GATHER=1,SOFTCAP=1
// STOF_VARIANTS: HEAD_DIM=256,DTYPE=1,BLOCK_N=64,STAGES=2 | HEAD_DIM=256,DTYPE=0,BLOCK_N=64,STAGES=2,OVERLAP=0 | HEAD_DIM=256,DTYPE=0,BLOCK_N=64,STAGES=2,SPLIT=1
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=1,BLOCK_M=64,BLOCK_N=128,STAGES=2,GATHER=1 | HEAD_DIM=128,DTYPE=0,BLOCK_M=64,BLOCK_N=64,STAGES=2,GATHER=1
// STOF_VARIANTS: HEAD_DIM=128,DTYPE=1,BLOCK_N=128,STAGES=2,BIAS=1 | HEAD_DIM=256,DTYPE=0,BLOCK_N=64,STAGES=2,SOFTCAP=1,BIAS=1 | HEAD_DIM=64,DTYPE=0,BLOCK_N=64,STAGES=3,SPLIT=1,BIAS=1
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0,BLOCK_M=192,BLOCK_N=128,STAGES=2 | HEAD_DIM=64,DTYPE=1,BLOCK_M=192,BLOCK_N=128,STAGES=3,PERSIST=1 | HEAD_DIM=64,DTYPE=0,BLOCK_M=192,BLOCK_N=64,STAGES=2,SOFTCAP=1
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0,BLOCK_M=64,BLOCK_N=64,STAGES=2,OVERLAP=0 | HEAD_DIM=64,DTYPE=1,BLOCK_M=64,BLOCK_N=64,STAGES=2,OVERLAP=0,PERSIST=1,SOFTCAP=1,BIAS=1
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0,BLOCK_N=128,STAGES=2,PERSIST=1 | HEAD_DIM=128,DTYPE=1,BLOCK_N=64,STAGES=3,OVERLAP=0,PERSIST=1 | HEAD_DIM=64,DTYPE=1,BLOCK_M=64,BLOCK_N=64,STAGES=4,PERSIST=1,BIAS=1,ALIBI=1
#include "sm90_common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef OVERLAP
#define OVERLAP 1
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

#ifndef BLOCK_M
#define BLOCK_M 128
#endif
#ifndef PERSIST
#define PERSIST 0
#endif
#ifndef WG_TRACE
#define WG_TRACE 0
#endif
// O leaves through the TMA (block mode; gather mode's rows may be
// permuted, q_rows, and split-KV writes its partials itself).
#define WG_TMA_O (!GATHER && !SPLIT)
#define WG_BLOCK_M BLOCK_M
// The format's row block of row block rb: BLOCK_M 192 reads a 64-row
// format (formats take power-of-two row blocks), the first of its three.
#define WG_FMT_RB(rb) (BLOCK_M == 192 ? 3 * (rb) : (rb))
#define WG_NCW (BLOCK_M / 64)              // consumer warpgroups
#define WG_THREADS (128 * (1 + WG_NCW))
// CTAs per SM (registers): 64-row tiles of head_dim 64 need few
// registers (O and S 32 floats a thread each): three CTAs, so that short
// rows (sparse masks) keep more loads in flight. With 64-key tiles
// only: the 128-key S tile's wgmma needs 90 registers at launch (ptxas).
#define WG_OCC3 (BLOCK_M == 64 && HEAD_DIM == 64 && BLOCK_N == 64)
// Four such CTAs an SM without the overlap inside the warpgroup (OVERLAP
// 0: S and P V are not in flight together), two stages, TMA loads: 64
// registers a thread at launch, 104 for the consumer warpgroup (ptxas -v:
// no spills, also with split-KV or one score modifier; all three modifiers
// with PERSIST spill a little; with the overlap, 104 spill and serialise
// the wgmma). stof__wgmma_ctas_per_sm mirrors it.
#define WG_OCC4 (WG_OCC3 && !OVERLAP && STAGES == 2 && !GATHER)
#define WG_MIN_BLOCKS (WG_OCC4 ? 4 : WG_OCC3 ? 3 : BLOCK_M == 64 ? 2 : 1)
#define WG_DB (HEAD_DIM / 64)                  // 64-column blocks
#define WG_Q_BYTES (WG_BLOCK_M * HEAD_DIM * 2)
#define WG_KV_BYTES (BLOCK_N * HEAD_DIM * 2)   // one slot of K (or V)
#define WG_WPR (BLOCK_N / 32)                  // bitmap words per tile row
#define WG_BITS_BYTES (WG_BLOCK_M * WG_WPR * 4)
#define WG_NQBUF (PERSIST ? 2 : 1)              // Q buffers
#define WG_OFF_K (WG_NQBUF * WG_Q_BYTES)
#define WG_OFF_V (WG_OFF_K + STAGES * WG_KV_BYTES)
#define WG_OFF_B (WG_OFF_V + STAGES * WG_KV_BYTES)
#define WG_OFF_ITEM (WG_OFF_B + STAGES * WG_BITS_BYTES)
// PERSIST: each Q buffer's work item {b, h, q0, n} (n < 0: no more items),
// stored by the producer before it arms the buffer's barrier, so that the
// consumers start an item without global loads of their own.
#define WG_ITEM_BYTES (PERSIST ? 2 * 16 : 0)
#define WG_OFF_BAR (WG_OFF_ITEM + WG_ITEM_BYTES)
#define WG_N_BARS (1 + 4 * STAGES + (PERSIST ? 3 : 0))
#define WG_OFF_META (WG_OFF_BAR + 8 * WG_N_BARS)
#define WG_OFF_IDX (WG_OFF_META + 8 * STAGES)
#if GATHER
#define WG_IDX_BYTES (2 * 2 * BLOCK_N * 4) // 2 slots x (K, V) x BLOCK_N
#else
#define WG_IDX_BYTES 0
#endif
#define WG_SMEM_USED (WG_OFF_IDX + WG_IDX_BYTES)
#define WG_SMEM_BYTES (WG_SMEM_USED + 1024)    // + alignment slack

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256,
              "HEAD_DIM must be 64, 128 or 256");
// head_dim 256: O is 128 floats a consumer thread, so S stays at 64 keys
// (32 floats), two consumer warpgroups share the registers, and two K/V
// stages of 32 KB each fit beside the 64 KB of Q. The gather copy
// passes (a quarter of a 128-byte swizzle period per pass) do not fit
// such rows.
static_assert(HEAD_DIM != 256 || (BLOCK_M == 128 && BLOCK_N == 64 &&
                                  STAGES == 2 && GATHER == 0),
              "HEAD_DIM 256 needs BLOCK_M 128, BLOCK_N 64, STAGES 2, block "
              "mode");
static_assert(BLOCK_M == 64 || BLOCK_M == 128 || BLOCK_M == 192,
              "BLOCK_M must be 64, 128 or 192");
static_assert(BLOCK_M != 192 || (HEAD_DIM == 64 && !GATHER && !SPLIT),
              "BLOCK_M 192 needs HEAD_DIM 64, block mode, no SPLIT");
static_assert(BLOCK_N == 64 || BLOCK_N == 128, "BLOCK_N must be 64 or 128");
static_assert(STAGES >= 2 && STAGES <= 4, "STAGES must be 2..4");
static_assert(DTYPE == 0 || DTYPE == 1, "DTYPE must be 0 (fp16) or 1 (bf16)");
static_assert(OVERLAP == 0 || OVERLAP == 1, "OVERLAP must be 0 or 1");
static_assert(GATHER == 0 || GATHER == 1, "GATHER must be 0 or 1");
static_assert(!(ALIBI && GATHER), "ALIBI needs block mode (key indices)");
static_assert(!(BIAS && GATHER), "BIAS needs block mode (key indices)");
static_assert(PERSIST == 0 || (PERSIST == 1 && !GATHER && !SPLIT),
              "PERSIST needs block mode without SPLIT");
static_assert(WG_KV_BYTES % 1024 == 0 && WG_Q_BYTES % 1024 == 0,
              "swizzle atoms must stay 1024-byte aligned");

#define STOF_TILE_PARTIAL_ 1 // STOF_TILE_PARTIAL in stof.h

// Registers per thread after setmaxnreg: what the producer gives back, the
// consumers take. BLOCK_M 128: the launch gives 168 to each of the 384
// threads; BLOCK_M 64: 128 to each of 256 (two CTAs per SM). The gather
// producer computes addresses: 32 registers (24 spill), so its consumers
// get 8 (BLOCK_M 128) or 32 (64) fewer; d=128 still fits without spilling
// (ptxas -v).
#if BLOCK_M == 192
// 128 a thread at launch (512 threads): 24 + 160 (head_dim 64, ptxas -v:
// no spills).
#define WG_PRODUCER_REGS "24"
#define WG_CONSUMER_REGS "160"
#elif BLOCK_M == 128
#if GATHER
#define WG_PRODUCER_REGS "32"
#define WG_CONSUMER_REGS "232"
#else
#define WG_PRODUCER_REGS "24"
#define WG_CONSUMER_REGS "240"
#endif
#elif WG_OCC4
// 64 a thread at launch (four CTAs of 256 threads): 24 + 104.
#define WG_PRODUCER_REGS "24"
#define WG_CONSUMER_REGS "104"
#elif WG_OCC3
// 80 a thread at launch (three CTAs of 256 threads): 24 + 136, or 32 +
// 128 for the gather producer.
#if GATHER
#define WG_PRODUCER_REGS "32"
#define WG_CONSUMER_REGS "128"
#else
#define WG_PRODUCER_REGS "24"
#define WG_CONSUMER_REGS "136"
#endif
#else
#if GATHER
#define WG_PRODUCER_REGS "32"
#define WG_CONSUMER_REGS "224"
#else
#define WG_PRODUCER_REGS "24"
#define WG_CONSUMER_REGS "232"
#endif
#endif

// The launch parameters, by value (__grid_constant__: the tensor maps are
// read in place). Mirrored by stof_attn_wgmma_params in src/attn_wgmma.c;
// both sides check the size and the offsets of `o` and `q`.
struct stof_attn_wgmma_params {
    stof_tmap tm_q, tm_k, tm_v;   // (head_dim, seq, heads, batch) maps
                                  // (block mode only)
    unsigned short *o;            // output, 16-byte aligned
    const int *row_ptr;           // n_row_blocks + 1 (gather: tile_ptr);
                                  // batch b's from row_ptr + b * rp_stride
    const int *col_idx;           // per tile: key block (gather: unused)
    const unsigned char *kind;    // per tile: 1 partial, 2 full
    const int *bitmap_idx;        // per tile: partial index / -1
    const unsigned *bitmaps;      // per partial tile: BLOCK_M x WG_WPR words
    const int *row_order;         // NULL or n_row_blocks row block indices
    stof_i64 o_stride[3];         // b, h, seq (elements)
    int batch, heads, seq_q, seq_k;
    int n_row_blocks;
    int bitmap_words_per_row;     // must be BLOCK_N / 32
    float scale_log2;             // softmax scale * log2(e), > 0
    int rp_stride;                // 0: one format for every batch
                                  // element; n_row_blocks: one per element
                                  // (mask families; block mode only);
                                  // -n_row_blocks: one per (element, head)
    int kv_group;                 // query heads per K/V head (GQA), >= 1;
                                  // the K/V maps hold heads / kv_group
    int persist_hg;               // PERSIST: the schedule (wg_sched): 0,
                                  // or +-(batch, head)s a group
    // Gather mode only (0 in block mode):
    const unsigned short *q, *k, *v; // inputs, 16-byte aligned
    const int *key_ptr;           // n_row_blocks + 1
    const int *keys;              // ascending key indices per row block
    const int *q_rows;            // NULL or seq_q tensor rows (see above)
    stof_i64 q_stride[3], k_stride[3], v_stride[3]; // b, h, seq (elements)
    float *lse;                   // NULL, or [batch][heads][seq_q]: each
                                  // row's log-sum-exp (natural log)
    float *o_part, *lse_part;     // SPLIT: the partials (attn_split.cuh)
    int n_split;                  // SPLIT: gridDim.z, >= 1
    float cap_in, cap_out;        // SOFTCAP: scale / softcap, softcap*log2 e
    int pad2_;
    const float *alibi;           // ALIBI: [heads] slopes
    const unsigned short *bias;   // BIAS: element (b, h, row, key) at b *
    stof_i64 bias_stride[3];      // bias_stride[0] + h * [1] + row * [2] +
                                  // key (16-bit, the dtype)
    const int *sched;             // PERSIST: NULL, or the list schedule:
                                  // gridDim.x + 1 offsets, then the items
                                  // (CTA x takes items [sched[x],
                                  // sched[x + 1]) in order; wg_sched)
    const int *k_lim;             // NULL, or [batch]: V rows of sequence b
                                  // at or past k_lim[b] are zeroed before
                                  // P V reads them (block mode; padding
                                  // may hold NaN: 0 x NaN is NaN)
    unsigned char tail_[40];      // to the maps' alignment on both sides
    stof_tmap tm_o;               // block mode: O's map, boxes of 64 rows
                                  // (each consumer warpgroup's stores)
};
static_assert(sizeof(stof_attn_wgmma_params) == 896,
              "stof_attn_wgmma_params layout");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// ---------------------------------------------------------------------------
// PTX helpers
// ---------------------------------------------------------------------------

// TMA store: the box at `src` to coordinates (c0, c1, c2, c3) of a 4-D map
// (rows outside the map are not written), in this thread's current bulk
// group.
__device__ __forceinline__ void tma_store4(const stof_tmap *map, int c0,
                                           int c1, int c2, int c3,
                                           unsigned src)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group "
                 "[%0, {%1, %2, %3, %4}], [%5];\n" ::"l"((stof_u64)map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
                 : "memory");
}

// 16-byte global -> shared copy; src_bytes 0 writes 16 zero bytes and reads
// nothing. No memory clobber: the shared loads of the row offsets may move
// ahead of it (the named barriers and mbarrier waits, which do clobber,
// keep the order that matters).
__device__ __forceinline__ void cp_async16(unsigned dst, const void *src,
                                           unsigned src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "r"(src_bytes));
}

// One arrival on `bar` when every cp.async this thread issued so far has
// landed; the barrier's expected count includes it (noinc).
__device__ __forceinline__ void cp_async_arrive(unsigned bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(
                     bar)
                 : "memory");
}

__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

__device__ __forceinline__ int wg_ldg_i32(const int *p)
{
    int v;
    asm volatile("ld.global.nc.b32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
}

// The same without volatile: the compiler may hoist and batch it.
__device__ __forceinline__ int wg_ldg_i32_nv(const int *p)
{
    int v;
    asm("ld.global.nc.b32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ int wg_ldg_u8(const unsigned char *p)
{
    unsigned v;
    asm volatile("ld.global.nc.u8 %0, [%1];\n" : "=r"(v) : "l"(p));
    return (int)v;
}

__device__ __forceinline__ float wg_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x)); // ex2(-inf) = +0
    return y;
}

// D (64 x N) += A (64 x 16, registers) * B (16 x N, smem, MN-major).
__device__ __forceinline__ void wg_mma_rs(float (&d)[32], const unsigned (&a)[4],
                                          stof_u64 db)
{
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n64k16.f32" WG_AB
                 " " WG_R32 ", {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_F32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db),
                   "r"(1));
}

__device__ __forceinline__ void wg_mma_rs(float (&d)[64], const unsigned (&a)[4],
                                          stof_u64 db)
{
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n128k16.f32" WG_AB
                 " " WG_R64 ", {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_F64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db),
                   "r"(1));
}

// ---------------------------------------------------------------------------
// Consumer steps
// ---------------------------------------------------------------------------

#define WG_SN (BLOCK_N / 2)   // S floats per thread
#define WG_ON (HEAD_DIM / 2)  // O floats per thread
#define WG_PK (BLOCK_N / 16)  // k-steps of P V

// S = Q K^T over HEAD_DIM/16 k-steps. dq, dk: descriptors of the first
// k-step; k-step kk is column block kk/4, byte offset 32*(kk%4) in a row.
__device__ __forceinline__ void wg_qk(float (&s)[WG_SN], stof_u64 dq,
                                      stof_u64 dk)
{
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
        const unsigned qo = ((kk >> 2) * (WG_BLOCK_M * 128) + (kk & 3) * 32) >> 4;
        const unsigned ko = ((kk >> 2) * (BLOCK_N * 128) + (kk & 3) * 32) >> 4;
        wg_mma_ss(s, dq + qo, dk + ko, kk > 0);
    }
}

// O += P V over BLOCK_N/16 k-steps of 16 keys (2048 bytes of V each).
// head_dim 256: two n = 128 wgmmas a k-step, on V's column blocks 0-1 and
// 2-3 (the second half of O: fragment index 64 + i is column 128 + the
// column of i, as the whole-row indexing 4 * dt + .. expects).
__device__ __forceinline__ void wg_pv(float (&o)[WG_ON],
                                      const unsigned (&pa)[WG_PK][4],
                                      stof_u64 dv)
{
#if HEAD_DIM == 256
    float(&lo)[64] = *reinterpret_cast<float(*)[64]>(&o[0]);
    float(&hi)[64] = *reinterpret_cast<float(*)[64]>(&o[64]);
    const stof_u64 half = (stof_u64)((2 * BLOCK_N * 128) >> 4);
#pragma unroll
    for (int ks = 0; ks < WG_PK; ks++) {
        wg_mma_rs(lo, pa[ks], dv + (stof_u64)((ks * 2048) >> 4));
        wg_mma_rs(hi, pa[ks], dv + half + (stof_u64)((ks * 2048) >> 4));
    }
#else
#pragma unroll
    for (int ks = 0; ks < WG_PK; ks++)
        wg_mma_rs(o, pa[ks], dv + (stof_u64)((ks * 2048) >> 4));
#endif
}

// Element j of S: n-tile j/4, row (warp rows) g + 8*((j%4)/2), column
// 8*(j/4) + 2*tq + j%2. r0: the tile row of g (hh = 0).
__device__ __forceinline__ void wg_mask(float (&s)[WG_SN], int kind, int col,
                                        const unsigned *bits, int r0, int tq,
                                        int seq_k)
{
    if (kind == STOF_TILE_PARTIAL_) {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const unsigned *row = bits + (r0 + 8 * hh) * WG_WPR;
            unsigned w[WG_WPR];
#pragma unroll
            for (int j = 0; j < WG_WPR; j++)
                w[j] = row[j] >> (2 * tq);
#pragma unroll
            for (int nt = 0; nt < BLOCK_N / 8; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (!((w[nt >> 2] >> (8 * (nt & 3) + e)) & 1u))
                        s[4 * nt + 2 * hh + e] = STOF_NEG_INF;
        }
    } else if (col * BLOCK_N + BLOCK_N > seq_k) {
        // A full tile hanging past seq_k: columns >= seq_k are -inf.
        const int lim = seq_k - col * BLOCK_N - 2 * tq;
#pragma unroll
        for (int j = 0; j < WG_SN; j++)
            if (8 * (j >> 2) + (j & 1) >= lim)
                s[j] = STOF_NEG_INF;
    }
}

#if SOFTCAP || ALIBI
// The score modifiers on S (stof_score_l2): element j is row r0 + 8 *
// ((j % 4) / 2) of the block and column 8 * (j / 4) + 2 * tq + j % 2 of
// the tile; dk0 = the tile's first key + 2 * tq - (q0 + r0).
__device__ __forceinline__ void wg_mods(float (&s)[WG_SN], float sl2,
                                        float cap_in, float cap_out,
                                        float slope_l2, int dk0)
{
#pragma unroll
    for (int j = 0; j < WG_SN; j++)
        s[j] = stof_score_l2(s[j], sl2, cap_in, cap_out, slope_l2,
                             dk0 + 8 * (j >> 2) + (j & 1) - 8 * ((j >> 1) & 1));
}
#define WG_MODS(s, col)                                                        \
    wg_mods(s, p.scale_log2, p.cap_in, p.cap_out, slope_l2,                   \
            (col) * BLOCK_N + 2 * tq - (q0 + r0))
#else
#define WG_MODS(s, col) ((void)0)
#endif

#if BIAS
// The additive bias of a tile: element j of S is row r0 + 8 * ((j % 4) /
// 2) and key k0 + 2 * tq + 8 * (j / 4) + j % 2 (k0: the tile's first
// key); brow[hh]: the bias row of fragment row r0
// + 8 hh (rows past seq_q read row seq_q - 1: their scores are never
// stored). wg_bias_load issues the tile's loads as soon as its key block
// is known (before S is computed, so their latency hides behind the
// tensor cores), with immediate offsets from one address per row when
// the tile lies inside seq_k; wg_bias adds them after the mask.
__device__ __forceinline__ void
wg_bias_load(unsigned (&u)[2][BLOCK_N / 8],
             const unsigned short *const (&brow)[2], int k0, int tq,
             int seq_k)
{
    const int c0 = k0 + 2 * tq;
    if (k0 + BLOCK_N <= seq_k) {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const unsigned short *r = brow[hh] + c0;
#pragma unroll
            for (int nt = 0; nt < BLOCK_N / 8; nt++)
                u[hh][nt] = stof_bias_ld2_full(r + 8 * nt);
        }
        return;
    }
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int nt = 0; nt < BLOCK_N / 8; nt++)
            u[hh][nt] =
                stof_bias_ld2(brow[hh], c0 + 8 * nt, seq_k - c0 - 8 * nt);
}

__device__ __forceinline__ void wg_bias(float (&s)[WG_SN],
                                        const unsigned (&u)[2][BLOCK_N / 8],
                                        float mul)
{
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int nt = 0; nt < BLOCK_N / 8; nt++)
            stof_bias_add2(u[hh][nt], s[4 * nt + 2 * hh],
                           s[4 * nt + 2 * hh + 1], mul);
}
#define WG_BIAS_LOAD(col)                                                      \
    wg_bias_load(bias_u, brow, (col) * BLOCK_N, tq, p.seq_k)
#define WG_BIAS(s) wg_bias(s, bias_u, bias_mul)
#else
#define WG_BIAS_LOAD(col) ((void)0)
#define WG_BIAS(s) ((void)0)
#endif

// Online softmax of one tile: updates the running max (scaled, log2
// domain) and sum, turns s into the probabilities and returns whether the
// O rows must be rescaled (by alpha). With WG_LAZY_RESCALE the max is
// kept, and O not rescaled, while no row of the warp's tile exceeds it by
// more than WG_MAX_SLACK (log2 units): the probabilities are then at most
// 2^slack, which the fp32 sums and the 16-bit P hold as well, and O / l
// is the same; the FMULs of the rescale and its exp2 drop out once the
// rows' maxima settle (FlashAttention-4's conditional rescaling). The
// decision is the warp's (a vote), so the rescale stays a uniform branch.
// The 192-row (dense) kernel: H100, 2026-11-25, dense 1-2% faster
// (16x12x2048x64 0.978 of the time), but bigbird and sliding tiles 1-4%
// slower with the 64-row kernels (their rows see few tiles: the vote costs
// more than it saves). Except the four-CTA one (WG_OCC4, no overlap)
// without score modifiers or bias (with them its persistent build would
// spill): H200, 2026-11-28, tuned bigbird at 16x12x2048x64 and
// 16x16x2048x64 1.3-1.9% faster, the overlapping 64-row kernel 3.6-4.2%
// slower.
#define WG_LAZY_RESCALE                                                        \
    (BLOCK_M == 192 || (WG_OCC4 && !SOFTCAP && !ALIBI && !BIAS))
#define WG_MAX_SLACK 8.0f

// The max of row half hh (rows r0 and r0 + 8) of the S tile, unscaled.
// WG_MAX_TREE: four partial maxima instead of one chain of BLOCK_N / 4
// dependent FMNMX on the tile's critical path. Only the 64-row kernel at
// head_dim 64 (H200, stof-bench-wgmma, 2026-11-28: 1-2% faster on all
// seven masks); the 128-row and head_dim 128 kernels measured 2-7% slower
// on dense and causal masks with it (their schedules changed, not the
// chain), so they keep the single chain.
#define WG_MAX_TREE (BLOCK_M == 64 && HEAD_DIM == 64)
__device__ __forceinline__ float wg_row_max(const float (&s)[WG_SN], int hh)
{
#if WG_MAX_TREE
    float mx[4] = {STOF_NEG_INF, STOF_NEG_INF, STOF_NEG_INF, STOF_NEG_INF};
#pragma unroll
    for (int nt = 0; nt < BLOCK_N / 8; nt++) {
        const int i = 2 * (nt & 1);
        mx[i] = fmaxf(mx[i], s[4 * nt + 2 * hh]);
        mx[i + 1] = fmaxf(mx[i + 1], s[4 * nt + 2 * hh + 1]);
    }
    float m = fmaxf(fmaxf(mx[0], mx[1]), fmaxf(mx[2], mx[3]));
#else
    float m = STOF_NEG_INF;
#pragma unroll
    for (int nt = 0; nt < BLOCK_N / 8; nt++) {
        m = fmaxf(m, s[4 * nt + 2 * hh]);
        m = fmaxf(m, s[4 * nt + 2 * hh + 1]);
    }
#endif
    // The four lanes of a quad hold the same row.
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    return fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
}

// s -> exp2(s * sl2 - mu) over row half hh; returns this lane's sum.
__device__ __forceinline__ float wg_row_exp(float (&s)[WG_SN], int hh,
                                            float sl2, float mu)
{
    float rs = 0.0f;
#pragma unroll
    for (int nt = 0; nt < BLOCK_N / 8; nt++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int j = 4 * nt + 2 * hh + e;
            const float pe = wg_exp2(fmaf(s[j], sl2, -mu));
            s[j] = pe;
            rs += pe;
        }
    }
    return rs;
}

__device__ __forceinline__ bool wg_softmax(float (&s)[WG_SN], float (&m_run)[2],
                                           float (&l_run)[2], float (&alpha)[2],
                                           float sl2)
{
#if WG_LAZY_RESCALE
    const float mx[2] = {wg_row_max(s, 0) * sl2, wg_row_max(s, 1) * sl2};
    // A row whose max so far is -inf (no key yet) takes any finite one.
    const bool grow = !(mx[0] <= m_run[0] + WG_MAX_SLACK) ||
                      !(mx[1] <= m_run[1] + WG_MAX_SLACK);
    const bool resc = __any_sync(0xffffffffu, grow);
#else
    const bool resc = true;
#endif
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
#if WG_LAZY_RESCALE
        if (resc) {
            const float m_new = fmaxf(m_run[hh], mx[hh]); // -inf stays -inf
            // Safe max: no allowed key so far -> subtract 0; exp2(-inf) = 0.
            const float mu = m_new == STOF_NEG_INF ? 0.0f : m_new;
            alpha[hh] = wg_exp2(m_run[hh] - mu);
            m_run[hh] = m_new;
        }
        const float mu = m_run[hh] == STOF_NEG_INF ? 0.0f : m_run[hh];
#else
        const float m_new = fmaxf(m_run[hh], wg_row_max(s, hh) * sl2);
        const float mu = m_new == STOF_NEG_INF ? 0.0f : m_new; // (as above)
        alpha[hh] = wg_exp2(m_run[hh] - mu);
        m_run[hh] = m_new;
#endif
        const float rs = wg_row_exp(s, hh, sl2, mu);
        // (partial: this lane's columns)
        l_run[hh] = resc ? l_run[hh] * alpha[hh] + rs : l_run[hh] + rs;
    }
    return resc;
}

__device__ __forceinline__ void wg_rescale(float (&o)[WG_ON],
                                           const float (&alpha)[2])
{
#pragma unroll
    for (int dt = 0; dt < HEAD_DIM / 8; dt++) {
        o[4 * dt + 0] *= alpha[0];
        o[4 * dt + 1] *= alpha[0];
        o[4 * dt + 2] *= alpha[1];
        o[4 * dt + 3] *= alpha[1];
    }
}

// P (16-bit) as the A fragments of the P V k-steps.
__device__ __forceinline__ void wg_convert(const float (&s)[WG_SN],
                                           unsigned (&pa)[WG_PK][4])
{
#pragma unroll
    for (int ks = 0; ks < WG_PK; ks++) {
        pa[ks][0] = stof_pack2(s[8 * ks + 0], s[8 * ks + 1]);
        pa[ks][1] = stof_pack2(s[8 * ks + 2], s[8 * ks + 3]);
        pa[ks][2] = stof_pack2(s[8 * ks + 4], s[8 * ks + 5]);
        pa[ks][3] = stof_pack2(s[8 * ks + 6], s[8 * ks + 7]);
    }
}

#if GATHER
// ---------------------------------------------------------------------------
// Gather producer (all 128 threads of warpgroup 0; pt = 0..127)
// ---------------------------------------------------------------------------

#define WG_CPR (HEAD_DIM / 8) // 16-byte chunks per row
#define WG_RPP (128 / WG_CPR) // rows per pass of the 128 producer threads
static_assert(WG_RPP % 8 == 0 && BLOCK_N % (4 * WG_RPP) == 0 &&
                  WG_BLOCK_M % (4 * WG_RPP) == 0,
              "gather passes keep the swizzle and come in groups of 4");
static_assert(WG_BITS_BYTES / 16 <= 128, "one bitmap chunk per thread");

// Q rows q0 .. q0 + BLOCK_M - 1 of the format (tensor rows q_rows[.] when
// q_rows is set), rows >= seq_q zero-filled; one arrival on bar_q when they
// landed.
__device__ __forceinline__ void wg_gather_q(const stof_attn_wgmma_params &p,
                                            int pt, int b, int h, int q0,
                                            unsigned dst, unsigned bar_q)
{
    const int pr = pt / WG_CPR, pc = pt % WG_CPR;
    const unsigned d0 = dst + (unsigned)((pc >> 3) * (WG_BLOCK_M * 128) +
                                         pr * 128 +
                                         (((pc & 7) ^ (pr & 7)) << 4));
    const unsigned short *qg =
        p.q + b * p.q_stride[0] + h * p.q_stride[1] + pc * 8;
#pragma unroll
    for (int i0 = 0; i0 < WG_BLOCK_M / WG_RPP; i0 += 4) {
        int row[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int gr = q0 + pr + (i0 + j) * WG_RPP;
            row[j] = gr < p.seq_q
                         ? (p.q_rows ? wg_ldg_i32_nv(p.q_rows + gr) : gr)
                         : -1;
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            cp_async16(d0 + (i0 + j) * (WG_RPP * 128),
                       qg + (row[j] >= 0 ? (stof_i64)row[j] * p.q_stride[2]
                                         : (stof_i64)0),
                       row[j] >= 0 ? 16u : 0u);
    }
    cp_async_arrive(bar_q);
}

// One K or V tile: row r (= pr + i * RPP) from `g` + off[r] * 16 bytes,
// zero-filled when r >= lim.
__device__ __forceinline__ void wg_gather_tile(unsigned dst,
                                               const unsigned char *g,
                                               const unsigned *off, int pr,
                                               int lim)
{
#pragma unroll
    for (int i0 = 0; i0 < BLOCK_N / WG_RPP; i0 += 4) {
        unsigned o[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            o[j] = off[pr + (i0 + j) * WG_RPP];
#pragma unroll
        for (int j = 0; j < 4; j++)
            cp_async16(dst + (i0 + j) * (WG_RPP * 128),
                       g + (stof_u64)o[j] * 16u,
                       pr + (i0 + j) * WG_RPP < lim ? 16u : 0u);
    }
}

// K and V row offsets of key `key` (-1: past the list's end: offset 0, a
// valid address that is never read) as row j of index slot `so`.
__device__ __forceinline__ void wg_idx_store(unsigned *so, int j, int key,
                                             stof_i64 k16, stof_i64 v16)
{
    so[j] = key >= 0 ? (unsigned)(key * k16) : 0u;
    so[BLOCK_N + j] = key >= 0 ? (unsigned)(key * v16) : 0u;
}
#endif // GATHER

#if !GATHER
// Rows `from` .. BLOCK_N - 1 of the V tile at `sv` (keys past the
// sequence's k_len: a padding row holding NaN or Inf would make P V NaN
// where P is 0) set to zero by one consumer warpgroup (thread wt of 128)
// before its P V reads them: the rows of each 64-column panel are 128-byte
// lines (the swizzle permutes chunks inside a line), then the writes are
// made visible to wgmma and the warpgroup meets at named barrier `bar`.
// Several warpgroups may write the same zeros.
__device__ __forceinline__ void wg_zero_v_rows(unsigned sv, int from, int wt,
                                               int bar)
{
    from = max(from, 0);
    constexpr int UNITS_ROW = HEAD_DIM / 8; // 16-byte units a row
    const int units = (BLOCK_N - from) * UNITS_ROW;
    for (int u = wt; u < units; u += 128) {
        const int r = from + u / UNITS_ROW, c = u % UNITS_ROW;
        const unsigned a = sv + (unsigned)((c >> 3) * (BLOCK_N * 128) +
                                           r * 128 + (c & 7) * 16);
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(a),
                     "r"(0u)
                     : "memory");
    }
    fence_proxy_async();
    named_bar_sync(bar, 128);
}
#endif

// One CTA's work item: row block rb of (batch b, head h), its first tile
// e0 in the format and its n non-empty tiles (split: this CTA's share,
// from the row block's tile lo).
struct wg_work {
    int rb, b, h, hk, q0, e0, n, lo;
};

// Work item (x, bh): x indexes row_order (or is the row block), bh = b *
// heads + h.
__device__ __forceinline__ wg_work wg_work_at(const stof_attn_wgmma_params &p,
                                              int x, int bh)
{
    wg_work w;
    w.rb = p.row_order ? wg_ldg_i32(p.row_order + x) : x;
    w.b = bh / p.heads;
    w.h = bh - w.b * p.heads;
    w.hk = p.kv_group > 1 ? w.h / p.kv_group : w.h; // K/V head (GQA)
    w.q0 = w.rb * WG_BLOCK_M;
    const int *rpb =
        p.row_ptr +
        (p.rp_stride >= 0
             ? (stof_i64)w.b * p.rp_stride
             : ((stof_i64)w.b * p.heads + w.h) * -(stof_i64)p.rp_stride);
    w.e0 = wg_ldg_i32(rpb + WG_FMT_RB(w.rb));
    w.n = wg_ldg_i32(rpb + WG_FMT_RB(w.rb) + 1) - w.e0; // non-empty tiles
    w.lo = 0;
#if SPLIT
    int hi; // split-KV: this CTA's share of the row block's tiles
    stof_split_range(w.n, p.n_split, w.lo, hi);
    w.e0 += w.lo;
    w.n = hi - w.lo;
#endif
    return w;
}

// PERSIST: the work items of this CTA, an item being one row block of one
// (batch, head), numbered item = rank * batch * heads + b * heads + h
// (rank: the row block's place in row_order, heaviest first). A sequence
// of them is dealt in rounds of gridDim.x, every other round in reverse
// (CTA x takes position x of round 0, gridDim.x - 1 - x of round 1, ...),
// so that a heavy-first sequence leaves every CTA about the same work:
//   p.persist_hg == 0: the items in order (rank by rank, every head's
//     heaviest row block first);
//   p.persist_hg = G > 0: the (batch, head)s in groups of G, in a group
//     rank by rank over its heads;
//   p.persist_hg = -G < 0: the same groups, in a group pairs of ranks i
//     and n_row_blocks - 1 - i of one head (the heaviest with the
//     lightest: a causal mask's pairs all weigh the same; an odd count's
//     middle row block alone), by i then head, a pair's two items dealt
//     together (one CTA computes them one after the other).
// A group's K and V stay in the L2 while its items run: in order, each
// round of CTAs reads every head's K and V again (dense 4x16x4096x64 on
// 132 SMs: 16 rounds of 2 row blocks, 16 times the K/V bytes of the
// one-CTA-per-item grid, whose CTAs start row block by row block within a
// head). The host picks the schedule (stof__wgmma_persist_heads), or
// deals the items itself (p.sched: stof__wgmma_persist_list, each item to
// the CTA with the least work so far, heaviest first, a group of heads
// after another: balanced like the one-CTA-per-item grid, with the
// groups' L2 reuse).
struct wg_sched {
    int k;    // this CTA's items so far (the Q buffers alternate over it)
    int r, h; // round; the pair's half (persist_hg < 0)
    int item; // the current item, -1 after the last
};

__device__ __forceinline__ void wg_sched_next(const stof_attn_wgmma_params &p,
                                              wg_sched &s)
{
    const int bh_n = p.batch * p.heads, nrb = p.n_row_blocks;
    const stof_i64 g = gridDim.x, x = blockIdx.x;
    if (p.sched) { // the host's list (stof__wgmma_persist_list)
        const int i = wg_ldg_i32(p.sched + x) + s.k + 1;
        if (i >= wg_ldg_i32(p.sched + x + 1)) {
            s.item = -1;
            return;
        }
        s.item = wg_ldg_i32(p.sched + g + 1 + i);
        s.k++;
        return;
    }
    if (p.persist_hg >= 0) {
        s.r++;
        const stof_i64 pos = (stof_i64)s.r * g + ((s.r & 1) ? g - 1 - x : x);
        if (pos >= (stof_i64)nrb * bh_n) {
            s.item = -1;
            return;
        }
        const int hg = p.persist_hg > 0 ? min(p.persist_hg, bh_n) : bh_n;
        const int gs = hg * nrb; // items of a whole group
        const int j = (int)(pos / gs), g0 = j * hg, n = min(hg, bh_n - g0);
        const int in = (int)(pos - (stof_i64)j * gs), r = in / n;
        s.item = r * bh_n + g0 + (in - r * n);
        s.k++;
        return;
    }
    const int hg = min(-p.persist_hg, bh_n), np = (nrb + 1) >> 1;
    for (;;) {
        if (s.h) {
            s.r++;
            s.h = 0;
        } else {
            s.h = 1;
        }
        const stof_i64 q = (stof_i64)s.r * g + ((s.r & 1) ? g - 1 - x : x);
        if (q >= (stof_i64)np * bh_n) {
            s.item = -1;
            return;
        }
        const int gs = hg * np; // pairs of a whole group
        const int j = (int)(q / gs), g0 = j * hg, n = min(hg, bh_n - g0);
        const int in = (int)(q - (stof_i64)j * gs), i = in / n;
        const int rank = s.h ? nrb - 1 - i : i;
        if (s.h && rank == i)
            continue; // the middle row block: a pair of one
        s.item = rank * bh_n + g0 + (in - i * n);
        s.k++;
        return;
    }
}

__device__ __forceinline__ wg_sched wg_sched_first(
    const stof_attn_wgmma_params &p)
{
    wg_sched s = {-1, -1, 1, -1};
    wg_sched_next(p, s);
    return s;
}

// The work items of this CTA: `for` over kq = 0, 1, ... with `item` the
// item's number. PERSIST: as wg_sched; otherwise the one item of the CTA.
#if PERSIST
#define WG_FOR_WORK(kq, item)                                                  \
    for (wg_sched ws_ = wg_sched_first(p); ws_.item >= 0;                     \
         wg_sched_next(p, ws_))                                                \
        if (const int kq = ws_.k, item = ws_.item; true)
#else
#define WG_FOR_WORK(kq, item) for (int item = 0, kq = 0; kq < 1; kq++)
#endif

// PERSIST: Q buffer j's work item (WG_OFF_ITEM).
__device__ __forceinline__ void wg_item_store(unsigned char *smem, int j,
                                              int4 v)
{
    *(int4 *)(smem + WG_OFF_ITEM + 16 * j) = v;
}
__device__ __forceinline__ int4 wg_item_load(const unsigned char *smem, int j)
{
    return *(const int4 *)(smem + WG_OFF_ITEM + 16 * j);
}

// The work item `item` of WG_FOR_WORK; without PERSIST the CTA's (row
// block position, sequence-head) (stof_cta_rb_bh).
__device__ __forceinline__ wg_work wg_work_of(const stof_attn_wgmma_params &p,
                                              int item)
{
#if PERSIST
    const int bh_n = p.batch * p.heads;
    return wg_work_at(p, item / bh_n, item % bh_n);
#else
    (void)item;
    int rb, bh;
    stof_cta_rb_bh(p.n_row_blocks, rb, bh);
    return wg_work_at(p, rb, bh);
#endif
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

// WG_TRACE (a diagnostic build, never a search candidate: stof-trace-wgmma
// compiles it): when the module's stof_wg_trace is set, CTA c (blockIdx.x +
// gridDim.x blockIdx.y) writes WG_TR_K words at stof_wg_trace[(c *
// (WG_TR_ITEMS + 1) + r) WG_TR_K + k]: record 0 the CTA (k 0 the SM clock
// after stof_grid_wait, 1 the global timer (ns) then, 2 the SM, 3 and 4
// the clock and the timer when the consumers are done, 5 the items), record
// 1 + i its i-th work item (i < WG_TR_ITEMS), stamped by the first consumer
// warp's lane 0 (k 0 ready for the item, 1 its Q seen, 2 its first K seen,
// 3 the first S done, 4 the first tile's softmax done, 5 the last S's
// tile done (the loop), 6 the last P V done, 7 O staged, 8 O stored, 9 its
// tiles) and by the producer (10 Q's load issued, 11 the first K's). SM
// clocks but where said.
#if WG_TRACE
#define WG_TR_ITEMS (PERSIST ? 64 : 1)
#define WG_TR_K 12
__device__ unsigned long long *stof_wg_trace;
__device__ __forceinline__ unsigned long long wg_clock()
{
    unsigned long long v;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(v));
    return v;
}
__device__ __forceinline__ void wg_tr(unsigned long long *t, int rec, int k,
                                      unsigned long long v)
{
    if (t && rec <= WG_TR_ITEMS)
        t[((unsigned long long)(blockIdx.x + gridDim.x * blockIdx.y) *
               (WG_TR_ITEMS + 1) +
           (unsigned)rec) *
              WG_TR_K +
          (unsigned)k] = v;
}
__device__ __forceinline__ void wg_tr_cta(unsigned long long *t, int k)
{
    unsigned long long v;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    wg_tr(t, 0, k, wg_clock());
    wg_tr(t, 0, k + 1, v);
    if (k == 0)
        wg_tr(t, 0, 2, sm);
}
// Item kq's stamp k by the first consumer warp's lane 0 (WG_TRC) or by
// the producer thread (WG_TRP).
#define WG_TRC(kq, k)                                                          \
    do {                                                                       \
        if (tid == 128)                                                        \
            wg_tr(wg_trp, 1 + (kq), (k), wg_clock());                          \
    } while (0)
#define WG_TRP(kq, k) wg_tr(wg_trp, 1 + (kq), (k), wg_clock())
#else
#define WG_TRC(kq, k) ((void)0)
#define WG_TRP(kq, k) ((void)0)
#endif

// ---------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(WG_THREADS, WG_MIN_BLOCKS)
stof_attn_wgmma(const __grid_constant__ stof_attn_wgmma_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const int tid = threadIdx.x;
#if !GATHER
    // The tensor maps' descriptors on their way before anything else (the
    // launch's own parameters, not memory an earlier kernel writes).
    if (tid == 32) {
        tma_prefetch_map(&p.tm_q);
        tma_prefetch_map(&p.tm_k);
        tma_prefetch_map(&p.tm_v);
#if WG_TMA_O
        tma_prefetch_map(&p.tm_o);
#endif
    }
#endif
    stof_grid_wait(); // programmatic dependent launch: see stof_common.cuh
    stof_grid_release();
#if WG_TRACE
    // (the trace's address read once: each stamp a clock read and a store)
    unsigned long long *const wg_trp = stof_wg_trace;
    if (tid == 128)
        wg_tr_cta(wg_trp, 0);
#endif
    extern __shared__ __align__(1024) unsigned char wg_smem_raw[];

    const int lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2; // 0 producer, 1.. consumers
    // Every offset below is from the first 1024-byte boundary.
    const unsigned raw = stof_smem_addr(wg_smem_raw);
    const unsigned pad = ((raw + 1023u) & ~1023u) - raw;
    unsigned char *smem = wg_smem_raw + pad;
    const unsigned sQ = raw + pad;
    const unsigned sK = sQ + WG_OFF_K;
    const unsigned sV = sQ + WG_OFF_V;
    const unsigned sB = sQ + WG_OFF_B;
    const unsigned bar_q = sQ + WG_OFF_BAR;
#define BAR_FULL_K(s) (bar_q + 8u * (1 + (s)))
#define BAR_FULL_V(s) (bar_q + 8u * (1 + STAGES + (s)))
#define BAR_EMPTY_K(s) (bar_q + 8u * (1 + 2 * STAGES + (s)))
#define BAR_EMPTY_V(s) (bar_q + 8u * (1 + 3 * STAGES + (s)))
    // Q buffer j (PERSIST: two, alternating over the work items): full
    // (the producer's Q load, or a plain arrival for an item without
    // tiles) and empty (PERSIST: each consumer warpgroup's storing thread
    // once the store of the item's O, staged in the buffer, has read it).
#define BAR_Q_FULL(j) ((j) ? bar_q + 8u * (1 + 4 * STAGES) : bar_q)
#define BAR_Q_EMPTY(j) (bar_q + 8u * (2 + 4 * STAGES + (j)))
    int *s_meta = (int *)(smem + WG_OFF_META); // [stage][2]: col, kind

#if GATHER
    // One work item (gather kernels are not persistent).
    const wg_work w = wg_work_of(p, 0);
    const int rb = w.rb, b = w.b, h = w.h, hk = w.hk, q0 = w.q0;
    const int e0 = w.e0, n = w.n;
    // The compacted key list from this CTA's first tile (at most n tiles of
    // it); its length stands in for seq_k in the mask.
    const int kb0 = wg_ldg_i32(p.key_ptr + rb) + w.lo * BLOCK_N;
    const int klim = max(0, min(wg_ldg_i32(p.key_ptr + rb + 1) - kb0,
                                n * BLOCK_N));
    // Arrivals: one cp.async.mbarrier.arrive.noinc per producer thread
    // (+ thread 0's after the meta store on fullK).
#define WG_NQ 128u
#define WG_NK 129u
#define WG_NV 128u
#define WG_GFENCE() fence_proxy_async()
#else
    const int klim = p.seq_k;
#define WG_NQ 1u
#define WG_NK 1u
#define WG_NV 1u
#define WG_GFENCE() ((void)0)
#endif

    if (tid == 0) {
        mb_init(bar_q, WG_NQ);
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            mb_init(BAR_FULL_K(s), WG_NK);
            mb_init(BAR_FULL_V(s), WG_NV);
            mb_init(BAR_EMPTY_K(s), 4 * WG_NCW);
            mb_init(BAR_EMPTY_V(s), 4 * WG_NCW);
        }
#if PERSIST
        mb_init(BAR_Q_FULL(1), 1);
        // (one arrival a consumer warpgroup: its storing thread's)
        mb_init(BAR_Q_EMPTY(0), WG_NCW);
        mb_init(BAR_Q_EMPTY(1), WG_NCW);
#endif
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        // ------------------------------------------------------------------
        // Producer
        // ------------------------------------------------------------------
        asm volatile("setmaxnreg.dec.sync.aligned.u32 " WG_PRODUCER_REGS ";\n" ::: "memory");
#if GATHER
        if (n > 0) {
            const int pt = tid;
            wg_gather_q(p, pt, b, h, q0, sQ, bar_q);
            const int pr = pt / WG_CPR, pc = pt % WG_CPR;
            const unsigned dkv = (unsigned)((pc >> 3) * (BLOCK_N * 128) +
                                            pr * 128 +
                                            (((pc & 7) ^ (pr & 7)) << 4));
            const unsigned char *kg =
                (const unsigned char *)(p.k + b * p.k_stride[0] +
                                        hk * p.k_stride[1] +
                                        pc * 8);
            const unsigned char *vg =
                (const unsigned char *)(p.v + b * p.v_stride[0] +
                                        hk * p.v_stride[1] +
                                        pc * 8);
            const stof_i64 k16 = p.k_stride[2] >> 3, v16 = p.v_stride[2] >> 3;
            const int *keys = p.keys + kb0;
            unsigned *s_idx = (unsigned *)(smem + WG_OFF_IDX); // [2][2][BN]
            if (pt < BLOCK_N)
                wg_idx_store(s_idx, pt, pt < klim ? wg_ldg_i32(keys + pt) : -1,
                             k16, v16);
            int kind = wg_ldg_u8(p.kind + e0);
            int bidx = wg_ldg_i32(p.bitmap_idx + e0);
            int s = 0;
            unsigned ph = 0;
            for (int t = 0; t < n; t++) {
                // Tile t+1: its key (stored at the end) and metadata.
                int kn = -1, n_kind = 0, n_bidx = 0;
                if (t + 1 < n) {
                    const int pos = (t + 1) * BLOCK_N + pt;
                    if (pt < BLOCK_N && pos < klim)
                        kn = wg_ldg_i32(keys + pos);
                    n_kind = wg_ldg_u8(p.kind + e0 + t + 1);
                    n_bidx = wg_ldg_i32(p.bitmap_idx + e0 + t + 1);
                }
                if (t >= STAGES)
                    mb_wait(BAR_EMPTY_K(s), ph ^ 1u);
                // Tile t's offsets (stored in iteration t-1) are visible.
                named_bar_sync(3, 128);
                const unsigned *so = s_idx + (t & 1) * (2 * BLOCK_N);
                const int lim = klim - t * BLOCK_N;
                wg_gather_tile(sK + s * WG_KV_BYTES + dkv, kg, so, pr, lim);
                if (kind == STOF_TILE_PARTIAL_ && pt < WG_BITS_BYTES / 16)
                    cp_async16(sB + s * WG_BITS_BYTES + pt * 16,
                               p.bitmaps +
                                   (stof_i64)bidx * (WG_BLOCK_M * WG_WPR) +
                                   pt * 4,
                               16u);
                if (pt == 0) {
                    s_meta[2 * s] = t; // the list position stands in for
                    s_meta[2 * s + 1] = kind; // the key block
                    mb_arrive(BAR_FULL_K(s));
                }
                cp_async_arrive(BAR_FULL_K(s));
                if (t >= STAGES)
                    mb_wait(BAR_EMPTY_V(s), ph ^ 1u);
                wg_gather_tile(sV + s * WG_KV_BYTES + dkv, vg, so + BLOCK_N,
                               pr, lim);
                cp_async_arrive(BAR_FULL_V(s));
                if (pt < BLOCK_N && t + 1 < n)
                    wg_idx_store(s_idx + ((t + 1) & 1) * (2 * BLOCK_N), pt, kn,
                                 k16, v16);
                kind = n_kind;
                bidx = n_bidx;
                if (++s == STAGES) {
                    s = 0;
                    ph ^= 1u;
                }
            }
            // Leave only once this thread's copies have landed.
            cp_async_wait_all();
        }
#else
        if (warp == 0 && lane == 0) {
            int s = 0;      // K/V slot and its phase, over all work items
            unsigned ph = 0;
            int gt = 0;     // tiles loaded so far
#if PERSIST
            int nk = 0;     // work items so far
#endif
            WG_FOR_WORK(kq, item) {
                const wg_work w = wg_work_of(p, item);
                // Q into buffer kq & 1 (PERSIST: once the consumers have
                // stored the O of the item that used it before).
                const int j = PERSIST ? (kq & 1) : 0;
                if (PERSIST && kq >= 2)
                    mb_wait(BAR_Q_EMPTY(j), ((kq >> 1) - 1) & 1u);
#if PERSIST
                // (n >= 0 here: a negative n is the end marker's)
                wg_item_store(smem, j,
                              make_int4(w.b, w.h, w.q0, max(w.n, 0)));
                nk = kq + 1;
#endif
                if (w.n > 0) {
                    mb_expect_tx(BAR_Q_FULL(j), WG_Q_BYTES);
#pragma unroll
                    for (int db = 0; db < WG_DB; db++)
                        tma_load4(sQ + j * WG_Q_BYTES + db * (WG_BLOCK_M * 128),
                                  &p.tm_q, db * 64, w.q0, w.h, w.b,
                                  BAR_Q_FULL(j));
                    WG_TRP(kq, 10);
                } else if (PERSIST) {
                    mb_arrive(BAR_Q_FULL(j)); // nothing to load: zeros
                }
                // Tile metadata, loaded one tile ahead.
                const int e0 = w.e0, n = w.n;
                int col = 0, kind = 0, bidx = 0;
                if (n > 0) {
                    col = wg_ldg_i32(p.col_idx + e0);
                    kind = wg_ldg_u8(p.kind + e0);
                    bidx = wg_ldg_i32(p.bitmap_idx + e0);
                }
                for (int t = 0; t < n; t++, gt++) {
                    int n_col = 0, n_kind = 0, n_bidx = 0;
                    if (t + 1 < n) {
                        n_col = wg_ldg_i32(p.col_idx + e0 + t + 1);
                        n_kind = wg_ldg_u8(p.kind + e0 + t + 1);
                        n_bidx = wg_ldg_i32(p.bitmap_idx + e0 + t + 1);
                    }
                    const int part = kind == STOF_TILE_PARTIAL_;
                    if (gt >= STAGES)
                        mb_wait(BAR_EMPTY_K(s), ph ^ 1u);
                    s_meta[2 * s] = col;
                    s_meta[2 * s + 1] = kind;
                    mb_expect_tx(BAR_FULL_K(s),
                                 WG_KV_BYTES + (part ? WG_BITS_BYTES : 0));
#pragma unroll
                    for (int db = 0; db < WG_DB; db++)
                        tma_load4(sK + s * WG_KV_BYTES + db * (BLOCK_N * 128),
                                  &p.tm_k, db * 64, col * BLOCK_N, w.hk, w.b,
                                  BAR_FULL_K(s));
                    if (part)
                        bulk_load(sB + s * WG_BITS_BYTES,
                                  p.bitmaps +
                                      (stof_i64)bidx * (WG_BLOCK_M * WG_WPR),
                                  WG_BITS_BYTES, BAR_FULL_K(s));
                    if (gt >= STAGES)
                        mb_wait(BAR_EMPTY_V(s), ph ^ 1u);
                    mb_expect_tx(BAR_FULL_V(s), WG_KV_BYTES);
#pragma unroll
                    for (int db = 0; db < WG_DB; db++)
                        tma_load4(sV + s * WG_KV_BYTES + db * (BLOCK_N * 128),
                                  &p.tm_v, db * 64, col * BLOCK_N, w.hk, w.b,
                                  BAR_FULL_V(s));
#if WG_TRACE
                    if (t == 0)
                        WG_TRP(kq, 11);
#endif
                    if (++s == STAGES) {
                        s = 0;
                        ph ^= 1u;
                    }
                    col = n_col;
                    kind = n_kind;
                    bidx = n_bidx;
                }
            }
#if PERSIST
            // The end: an item with n = -1 in the next Q buffer.
            const int j = nk & 1;
            if (nk >= 2)
                mb_wait(BAR_Q_EMPTY(j), ((nk >> 1) - 1) & 1u);
            wg_item_store(smem, j, make_int4(0, 0, 0, -1));
            mb_arrive(BAR_Q_FULL(j));
#endif
        }
#endif
        return;
    }

    // ----------------------------------------------------------------------
    // Consumers
    // ----------------------------------------------------------------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 " WG_CONSUMER_REGS ";\n" ::: "memory");
    const int cw = wg - 1;        // rows 64 cw .. 64 cw + 63 of the block
    const int wl = warp & 3;      // warp inside the warpgroup: 16 rows
    const int g = lane >> 2, tq = lane & 3;
    const int r0 = cw * 64 + wl * 16 + g; // tile row of fragment row g
#if SOFTCAP || ALIBI
    const float sl2 = 1.0f; // S is in log2 units after WG_MODS
#else
    const float sl2 = p.scale_log2;
#endif
    const unsigned *s_bits = (const unsigned *)(smem + WG_OFF_B);
    int s = 0;      // K/V slot and its phase, over all work items
    unsigned ph = 0;
#if PERSIST
    // The Q buffer whose O store may still be reading it (-1: none): its
    // storing thread waits for that read and gives the buffer back to the
    // producer under the next item's first tile, before its own store, or
    // at the end, whichever comes first.
    int o_pend = -1;
#define WG_O_RELEASE()                                                         \
    do {                                                                       \
        if ((tid & 127) == 0 && o_pend >= 0) {                                 \
            bulk_wait_read<0>();                                               \
            mb_arrive(BAR_Q_EMPTY(o_pend));                                    \
        }                                                                      \
        o_pend = -1;                                                           \
    } while (0)
#else
#define WG_O_RELEASE() ((void)0)
#endif

#if PERSIST
    // The producer's items, in order, through the Q buffers (the barrier
    // of an item without tiles, and of the end, completes by a plain
    // arrival), so that the buffers' phases stay in step.
    for (int kq = 0;; kq++) {
        const int j = kq & 1;
        WG_TRC(kq, 0);
        mb_wait(BAR_Q_FULL(j), (kq >> 1) & 1u);
        const int4 wi = wg_item_load(smem, j);
        if (wi.w < 0) {
            WG_O_RELEASE();
#if WG_TRACE
            if (tid == 128) {
                wg_tr_cta(wg_trp, 3);
                wg_tr(wg_trp, 0, 5, (unsigned)kq);
            }
#endif
            break;
        }
        const int b = wi.x, h = wi.y, q0 = wi.z, n = wi.w;
        WG_TRC(kq, 1);
#if WG_TRACE
        if (tid == 128)
            wg_tr(wg_trp, 1 + kq, 9, (unsigned)n);
#endif
#else
    WG_FOR_WORK(kq, item) {
#if !GATHER
        const wg_work w = wg_work_of(p, item);
        const int b = w.b, h = w.h, q0 = w.q0, n = w.n;
#endif
        const int j = 0;
#endif
        // This item's Q buffer (its O is staged there at the end).
        const unsigned sQj = sQ + j * WG_Q_BYTES;
#if !GATHER
        // Keys of V read into O: up to the sequence's k_len (a family
        // instance's; the tail past seq_k is the map's zero fill).
        const int v_lim = p.k_lim ? min(p.seq_k, max(0, wg_ldg_i32(p.k_lim + b)))
                                  : p.seq_k + BLOCK_N;
#define WG_VCUT(st) (v_lim - s_meta[2 * (st)] * BLOCK_N)
#define WG_VZERO(st, vc)                                                       \
    do {                                                                       \
        if ((vc) < BLOCK_N)                                                    \
            wg_zero_v_rows(sV + (st) * WG_KV_BYTES, (vc), tid & 127, 1 + cw);  \
    } while (0)
#else
#define WG_VCUT(st) BLOCK_N
#define WG_VZERO(st, vc) ((void)0)
#endif
#if ALIBI
        const float slope_l2 = p.alibi[h] * STOF_LOG2E;
#else
        const float slope_l2 = 0.0f;
        (void)slope_l2;
#endif
#if BIAS
        const unsigned short *brow[2];
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int gr = min(q0 + r0 + 8 * hh, p.seq_q - 1);
            brow[hh] = p.bias + b * p.bias_stride[0] + h * p.bias_stride[1] +
                       (stof_i64)gr * p.bias_stride[2];
        }
        unsigned bias_u[2][BLOCK_N / 8]; // the current tile's bias pairs
        // S in log2 units after WG_MODS; else raw q.k, which the softmax
        // scales (scale_log2 > 0: the wgmma kinds take no negative scale), so
        // the bias comes in divided by the scale.
        const float bias_mul =
            (SOFTCAP || ALIBI) ? STOF_LOG2E : STOF_LOG2E / p.scale_log2;
#endif

        float oacc[WG_ON], sacc[WG_SN];
        unsigned pa[WG_PK][4];
        float m_run[2] = {STOF_NEG_INF, STOF_NEG_INF}, l_run[2] = {0.0f, 0.0f};
        float alpha[2];
#pragma unroll
        for (int i = 0; i < WG_ON; i++)
            oacc[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < WG_SN; i++)
            sacc[i] = 0.0f;

#if !PERSIST
        WG_TRC(kq, 0);
        if (n > 0)
            mb_wait(BAR_Q_FULL(0), 0u);
        WG_TRC(kq, 1);
#if WG_TRACE
        if (tid == 128)
            wg_tr(wg_trp, 1 + kq, 9, (unsigned)n);
#endif
#endif
        if (n > 0) {
            // Descriptors of k-step 0: Q rows 64 cw.., K and V of slot 0.
            const stof_u64 dq = wg_desc(sQj + cw * 64 * 128, 16, 1024);
            const stof_u64 dk0 = wg_desc(sK, 16, 1024);
            const stof_u64 dv0 = wg_desc(sV, BLOCK_N * 128, 1024);
            const stof_u64 dslot = (stof_u64)(WG_KV_BYTES >> 4);
            WG_GFENCE();
#if OVERLAP
            // Tile 0: S, softmax, P (nothing to overlap with yet).
            mb_wait(BAR_FULL_K(s), ph);
            int vc_pend = WG_VCUT(s); // of the tile whose P V is next
            WG_TRC(kq, 2);
            WG_GFENCE();
            WG_BIAS_LOAD(s_meta[2 * s]);
            wg_fence();
            wg_qk(sacc, dq, dk0 + (stof_u64)s * dslot);
            wg_commit();
            wg_wait<0>();
            WG_TRC(kq, 3);
            wg_keep(sacc);
            WG_MODS(sacc, s_meta[2 * s]);
            wg_mask(sacc, s_meta[2 * s + 1], s_meta[2 * s],
                    s_bits + s * (WG_BLOCK_M * WG_WPR), r0, tq, klim);
            __syncwarp();
            if (lane == 0)
                mb_arrive(BAR_EMPTY_K(s));
            WG_BIAS(sacc);
            wg_softmax(sacc, m_run, l_run, alpha, sl2);
            wg_convert(sacc, pa);
            WG_TRC(kq, 4);
            WG_O_RELEASE();
            for (int t = 1; t < n; t++) {
                const int ps = s;
                const unsigned pph = ph;
                if (++s == STAGES) {
                    s = 0;
                    ph ^= 1u;
                }
                mb_wait(BAR_FULL_K(s), ph);
                const int vc_next = WG_VCUT(s);
                WG_BIAS_LOAD(s_meta[2 * s]);
                mb_wait(BAR_FULL_V(ps), pph);
                WG_GFENCE();
                WG_VZERO(ps, vc_pend);
                vc_pend = vc_next;
                wg_fence();
                wg_qk(sacc, dq, dk0 + (stof_u64)s * dslot);
                wg_commit();
                wg_pv(oacc, pa, dv0 + (stof_u64)ps * dslot);
                wg_commit();
                wg_wait<1>(); // S(t) done; P(t-1) V(t-1) may still run
                wg_keep(sacc);
                WG_MODS(sacc, s_meta[2 * s]);
                wg_mask(sacc, s_meta[2 * s + 1], s_meta[2 * s],
                        s_bits + s * (WG_BLOCK_M * WG_WPR), r0, tq, klim);
                __syncwarp();
                if (lane == 0)
                    mb_arrive(BAR_EMPTY_K(s));
                WG_BIAS(sacc);
                const bool resc = wg_softmax(sacc, m_run, l_run, alpha, sl2);
                wg_wait<0>();
                wg_keep(oacc);
                __syncwarp();
                if (lane == 0)
                    mb_arrive(BAR_EMPTY_V(ps));
                if (resc)
                    wg_rescale(oacc, alpha);
                wg_convert(sacc, pa);
            }
            WG_TRC(kq, 5);
            mb_wait(BAR_FULL_V(s), ph);
            WG_GFENCE();
            WG_VZERO(s, vc_pend);
            wg_fence();
            wg_pv(oacc, pa, dv0 + (stof_u64)s * dslot);
            wg_commit();
            wg_wait<0>();
            wg_keep(oacc);
            WG_TRC(kq, 6);
            __syncwarp();
            if (lane == 0)
                mb_arrive(BAR_EMPTY_V(s));
            if (++s == STAGES) { // the next item starts at the next slot
                s = 0;
                ph ^= 1u;
            }
#else
            for (int t = 0; t < n; t++) {
                mb_wait(BAR_FULL_K(s), ph);
                const int vc = WG_VCUT(s);
#if WG_TRACE
                if (t == 0)
                    WG_TRC(kq, 2);
#endif
                WG_GFENCE();
                WG_BIAS_LOAD(s_meta[2 * s]);
                wg_fence();
                wg_qk(sacc, dq, dk0 + (stof_u64)s * dslot);
                wg_commit();
                wg_wait<0>();
#if WG_TRACE
                if (t == 0)
                    WG_TRC(kq, 3);
#endif
                wg_keep(sacc);
                WG_MODS(sacc, s_meta[2 * s]);
                wg_mask(sacc, s_meta[2 * s + 1], s_meta[2 * s],
                        s_bits + s * (WG_BLOCK_M * WG_WPR), r0, tq, klim);
                __syncwarp();
                if (lane == 0)
                    mb_arrive(BAR_EMPTY_K(s));
                WG_BIAS(sacc);
                if (wg_softmax(sacc, m_run, l_run, alpha, sl2))
                    wg_rescale(oacc, alpha);
                wg_convert(sacc, pa);
#if WG_TRACE
                if (t == 0)
                    WG_TRC(kq, 4);
                if (t == n - 1)
                    WG_TRC(kq, 5);
#endif
                if (t == 0)
                    WG_O_RELEASE();
                mb_wait(BAR_FULL_V(s), ph);
                WG_GFENCE();
                WG_VZERO(s, vc);
                wg_fence();
                wg_pv(oacc, pa, dv0 + (stof_u64)s * dslot);
                wg_commit();
                wg_wait<0>();
                wg_keep(oacc);
#if WG_TRACE
                if (t == n - 1)
                    WG_TRC(kq, 6);
#endif
                __syncwarp();
                if (lane == 0)
                    mb_arrive(BAR_EMPTY_V(s));
                if (++s == STAGES) {
                    s = 0;
                    ph ^= 1u;
                }
            }
#endif
        }

        // ---- epilogue: O / l, staged through this warpgroup's sQ rows ----
        float inv[2];
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float l = l_run[hh];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv[hh] = l > 0.0f ? 1.0f / l : 0.0f; // no key -> zeros
            const int gr = q0 + r0 + 8 * hh;
#if SPLIT
            float *lse_out = p.lse_part + (stof_i64)blockIdx.z * p.batch *
                                              p.heads * p.seq_q;
#else
            float *lse_out = p.lse;
#endif
            if (lse_out && tq == 0 && gr < p.seq_q) {
                // m_run is the row's max in log2 units (scores * sl2).
#if GATHER
                const int orow = p.q_rows ? wg_ldg_i32_nv(p.q_rows + gr) : gr;
#else
                const int orow = gr;
#endif
                lse_out[((stof_i64)b * p.heads + h) * p.seq_q + orow] =
                    l > 0.0f ? (m_run[hh] + log2f(l)) * 0.69314718f
                             : STOF_NEG_INF;
            }
        }
#if SPLIT
        // Split-KV: every thread stores its own fragments of O / l in fp32 and
        // stof_attn_combine writes the output.
        {
            const stof_i64 bh_rows = (stof_i64)p.batch * p.heads * p.seq_q;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int gr = q0 + r0 + 8 * hh;
                if (gr >= p.seq_q)
                    continue;
#if GATHER
                const int orow = p.q_rows ? wg_ldg_i32_nv(p.q_rows + gr) : gr;
#else
                const int orow = gr;
#endif
                const stof_i64 row =
                    ((stof_i64)b * p.heads + h) * p.seq_q + orow;
#pragma unroll
                for (int dt = 0; dt < HEAD_DIM / 8; dt++)
                    stof_split_store2(p.o_part, blockIdx.z, bh_rows, row,
                                      8 * dt + 2 * tq,
                                      oacc[4 * dt + 2 * hh] * inv[hh],
                                      oacc[4 * dt + 2 * hh + 1] * inv[hh]);
            }
            return;
        }
#endif
        // Every warp of the warpgroup has waited for its last wgmma: nothing
        // reads these Q rows any more. O / l staged there by stmatrix: per
        // 16 columns k, the four 8 x 8 fragments (rows 0-7, 8-15) x
        // (columns 16k.., 16k + 8..) of the warp's 16 rows; lane l gives
        // row l % 8 of fragment l / 8.
        named_bar_sync(1 + cw, 128);
        {
            const int fr =
                cw * 64 + wl * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
            for (int k = 0; k < HEAD_DIM / 16; k++) {
                const int c = 2 * k + (lane >> 4); // 16-byte chunk of the row
                st_matrix4(sQj + (c >> 3) * (WG_BLOCK_M * 128) + fr * 128 +
                               (((c & 7) ^ (fr & 7)) << 4),
                           stof_pack2(oacc[8 * k] * inv[0],
                                      oacc[8 * k + 1] * inv[0]),
                           stof_pack2(oacc[8 * k + 2] * inv[1],
                                      oacc[8 * k + 3] * inv[1]),
                           stof_pack2(oacc[8 * k + 4] * inv[0],
                                      oacc[8 * k + 5] * inv[0]),
                           stof_pack2(oacc[8 * k + 6] * inv[1],
                                      oacc[8 * k + 7] * inv[1]));
            }
        }
#if WG_TMA_O
        // The staged rows to the TMA (async proxy), then one thread of the
        // warpgroup stores them: HEAD_DIM / 64 boxes of 64 x 64, rows past
        // seq_q clipped by the map. (H200, stof-trace-wgmma: an item's
        // stores 950 -> 360 cycles; the tuned attention 1-2.5% faster at
        // the layer stacks' shapes, 2026-11-28.)
        fence_proxy_async();
        named_bar_sync(1 + cw, 128);
        WG_TRC(kq, 7);
        if ((tid & 127) == 0) {
            WG_O_RELEASE();
#pragma unroll
            for (int db = 0; db < WG_DB; db++)
                tma_store4(&p.tm_o, db * 64, q0 + cw * 64, h, b,
                           sQj + db * (WG_BLOCK_M * 128) + cw * 64 * 128);
            bulk_commit();
        }
#if PERSIST
        // Buffer j goes back to the producer once the store has read it,
        // under the next item's first tile (wg_o_release).
        o_pend = j;
#endif
#else
        named_bar_sync(1 + cw, 128);
        WG_TRC(kq, 7);
        unsigned char *const smem_o = smem + j * WG_Q_BYTES;
        unsigned short *og = p.o + b * p.o_stride[0] + h * p.o_stride[1];
        constexpr int CPR = HEAD_DIM / 8; // 16-byte chunks per row
        const int ti = tid & 127;
#pragma unroll
        for (int i = 0; i < 64 * CPR / 128; i++) {
            const int idx = ti + 128 * i;
            const int r = cw * 64 + idx / CPR, c = idx % CPR;
            const int gr = q0 + r;
            if (gr < p.seq_q) {
                const unsigned off =
                    (c >> 3) * (WG_BLOCK_M * 128) + r * 128 +
                    (((c & 7) ^ (r & 7)) << 4);
                const uint4 v4 = *(const uint4 *)(smem_o + off);
                const int orow = p.q_rows ? wg_ldg_i32_nv(p.q_rows + gr) : gr;
                *(uint4 *)(og + (stof_i64)orow * p.o_stride[2] + c * 8) = v4;
            }
        }
#endif
        WG_TRC(kq, 8);
    } // the work items
#if WG_TMA_O && !PERSIST
    // The store reads this CTA's shared memory: not before it is done.
    if ((tid & 127) == 0)
        bulk_wait_read<0>();
#endif
#if WG_TRACE && !PERSIST
    if (tid == 128) {
        wg_tr_cta(wg_trp, 3);
        wg_tr(wg_trp, 0, 5, 1u);
    }
#endif
#else
    __trap(); // needs sm_90a (wgmma, setmaxnreg)
#endif
}
