// gemm_wgmma.cu - C = epilogue(A W^T) for sm_90a (Hopper): TMA loads,
// wgmma, a producer warpgroup and two consumer warpgroups, persistent.
// STOF_NEEDS_SM90A
//
// Same problem and epilogue semantics as gemm.cu (see src/kernels/gemm.h):
// A [M][K] (lda), W [N][K] (ldw, an nn.Linear weight), C and residual
// [M][N] (ldc), 16-bit (DTYPE), fp32 accumulation; on v = acc:
//   BIAS      v += bias[n]
//   ACT       v = act(v): 0 none, 1 gelu (tanh), 2 gelu (erf), 3 relu,
//             4 silu
//   RESIDUAL  v += residual[m][n]
//   ROPE      (instead of ACT, RESIDUAL: the QKV projection) after the
//             bias, rotary position embeddings in the heads of ROPE_HD
//             columns below rope_cols: row m (position m % rope_seq)
//             rotates its pairs (i, i + ROPE / 2), i < ROPE / 2, by
//             rope_tab[position][i] = (cos, sin) (src/kernels/gemm.h)
// then v is rounded to the dtype once and stored, or with
//   NORM      1 LayerNorm, 2 RMSNorm over the whole row (gamma, beta; eps),
//             the rounded v of the row normalised in fp32, optionally
//             (WRITE_PRE) the rounded v stored to pre (the semantics of
//             gemm.cu's row-complete variant; the variance from each
//             tile's sum and squares about its own mean, combined).
// NORM (ACT 0, not GATED, not CLUSTER): a row of C is GW_NC =
// ceil(N_TOTAL / BLOCK_N) <= 16 tiles (N_TOTAL, the N compiled in, must be
// the launch's N), tiles numbered row by row, and the grid (a multiple of
// GW_NC CTAs, all resident: a cooperative launch) walks them in rounds of
// gridDim.x, so a row's tiles run in the same round, each CTA always in
// the same tile column. After the K loop each warp computes the
// statistics of its 16 rows over the tile's columns (LayerNorm: the sum
// and the sum of squares about the tile's own mean; RMSNorm: the sum of
// squares) and writes them to the workspace ws, one 64-bit word a row and
// tile that is its own flag (gw_put_stat: never zero once written), then
// polls the same rows' words of the row's other tiles until none is zero
// (a warp polls one word a tile, then loads them all), not waiting for
// the rest of its warpgroup: no fence, no counter to wait on. Every CTA
// combines them in tile order, so all agree on each row's mean and rstd
// bit for bit. With PINGPONG the wait passes under the other warpgroup's
// K loop. Then the readers of a warp's rows count themselves on a counter
// (GW_SLICES a tile row) and the last clears the words and the counter
// (relaxed: each reader's loads returned their values before it
// arrived), so ws stays ready for the next launch (zeroed once when
// allocated: stof__gemm_ws_bytes). Measured (H100, GW_TRACE, bias + residual +
// LayerNorm, 4096 x 768 x 768, 128 x 192): a release arrival on a row
// counter, an acquire poll by one thread and then every thread's loads of
// the statistics took the epilogue 9300 cycles, the words 5900 (a launch
// 0.0145 -> 0.0132 ms); every lane polling all its words instead flooded
// the L2 and gained half of that. C is written once; no norm kernel.
//
// Compile-time parameters (-D): DTYPE 0 fp16 / 1 bf16; BLOCK_N 64, 128,
// 192 or 256 (C tile columns; the tile has 128 rows, K goes in steps of
// 64; 192 makes a 768-wide row 4 tiles: 4096 tokens are 128 tiles, one
// round on 132 SMs); STAGES 2..6 (K-steps of A and W in flight); BIAS,
// ACT, RESIDUAL; GATED (BLOCK_N 128 or 256); PINGPONG (BLOCK_N 64 or 128,
// below); CLUSTER 1 or 2 (below; not with 192); NORM 0..2, WRITE_PRE,
// N_TOTAL (above, with the workspace); CSLOT (a tile's C units in the
// pipeline's slots: GW_NCS below).
//
// Grid: at most one CTA per SM (gridDim.x; the host passes the SM count),
// 384 threads. The C tiles (ceil(M/128) x ceil(N/BLOCK_N)) are numbered in
// groups of GW_GROUP_M tile rows (tile rows fastest inside a group, so
// the CTAs running together share W tiles and A tiles in L2) and CTA x
// computes tiles x, x + gridDim.x, ... (a static schedule).
//
// Roles:
//   warpgroup 0   producer: one thread issues every TMA load (A box 64 x
//                 128, W box 64 x BLOCK_N per K-step, 128-byte swizzle,
//                 rows and columns past M, N, K arrive as zeros) into
//                 STAGES slots, running on into the next tile while the
//                 consumers finish the current one;
//   warpgroups 1, 2 consumers: warpgroup 1 + c owns rows 64c .. 64c+63
//                 of the tile: per K-step four wgmma m64 n BLOCK_N k16
//                 (A and W from shared memory, both K-major), one K-step's
//                 group kept in flight (the slot of K-step k-1 is released
//                 once K-step k's group is issued and k-1's has retired);
//                 then the epilogue on the accumulators (fragment pairs:
//                 row g / g + 8 of each 16-row warp slice, columns 2 tq,
//                 2 tq + 1 of each 8-column block), written rounded into
//                 64 x 64 C units in shared memory (stmatrix: four 8 x 8
//                 fragments a warp instruction), each stored by TMA
//                 (one thread) while the warpgroup goes on with the next
//                 unit and its next tile. Measured (H100, fp16, 16384 x
//                 2304 x 768): storing each pair from registers took a
//                 third of the kernel's time.
//   PINGPONG 1    the two consumer warpgroups take whole tiles in turn
//                 (the CTA's tile i goes to warpgroup i % 2, all 128 rows
//                 in two 64-row halves, 128 x BLOCK_N accumulators a
//                 thread): a warpgroup starts its K loop once the other's
//                 K loop has passed all its waits (order[c]), so the K
//                 loops take turns on the tensor cores and each epilogue
//                 runs under the other warpgroup's K loop. With both
//                 warpgroups on one tile (PINGPONG 0) the tensor cores
//                 idle during the epilogue, a large share at small K.
//   CLUSTER 2     the grid runs in clusters of two CTAs (launched with
//                 the cluster dimension; gridDim.x even) that take tile
//                 rows 2i and 2i + 1 of the same tile column together: the
//                 W tile is read from L2 once for both, each CTA's
//                 producer loading half of its rows (GATED: the gate half
//                 on rank 0, the up half on rank 1) and multicasting them
//                 into both CTAs' slots. A K-step's slot is free again only
//                 when the consumers of both CTAs have released it, so
//                 each consumer warp arrives on the empty barrier of both.
//                 Measured (H100, fp16, layer shapes): 128 x 256 pairs
//                 within 6% of the same tile alone, 2% faster at 16384 x
//                 768 x 3072; so the K loop's gap to cuBLASLt is not the
//                 L2 traffic of the W tiles. An
//                 odd last tile row is computed by its pair's rank 1 on
//                 rows past M (zeros in, stores clipped), so the two CTAs
//                 always walk the same K-steps.
// mbarriers: full[s] (1 arrival + the slot's bytes), empty[s] (lane 0 of
// each consumer warp that reads the slot, of each CTA of the cluster: 8,
// or 4 with PINGPONG, times CLUSTER), order[2] (PINGPONG: one arrival per
// tile of warpgroup c), res[2] (RESIDUAL: a tile's residual units of
// warpgroup c, 1 arrival + their bytes).
//
// Shared memory (dynamic, from the first 1024-byte boundary;
// stof__gemm_smem_bytes adds the 1024 bytes of slack): STAGES x {A 128
// rows x 128 B, W BLOCK_N rows x 128 B}; each warpgroup's ring of GW_CBUF
// C units of 64 rows x 128 B (the TMA's 128-byte swizzle; 2, or 4 with a
// residual or a norm; none with CSLOT, whose tiles stage them in the
// slots); 2 x STAGES + 4 mbarriers; NORM: gamma and beta of the CTA's
// BLOCK_N columns (fp32).
// 128 x 256 takes up to 4 stages (3 with a residual or a norm, 4 again
// with CSLOT), 128 x 192 4 (5 with CSLOT), 128 x 128 up to 6 (5 with a
// residual or a norm, 6 with CSLOT). Measured (H200, fp16, GW_TRACE, one
// round): BERT-large's FFN2 + bias + residual + LayerNorm, 4096 x 1024 x
// 4096 at 128 x 256, 0.0531 ms with a ring and three stages, 0.0503 with
// CSLOT and four (K loop 68.9k -> 65.8k cycles, a plain four-stage
// one's 65.5k); its output projection (K 1024) 0.0181 -> 0.0179.
//
// STOF_VARIANTS: DTYPE=0,BLOCK_N=256,STAGES=3,BIAS=1,ACT=2,RESIDUAL=0 | DTYPE=1,BLOCK_N=128,STAGES=5,BIAS=0,ACT=0,RESIDUAL=1 | DTYPE=0,BLOCK_N=256,STAGES=2,BIAS=1,ACT=3,RESIDUAL=1
// STOF_VARIANTS: DTYPE=1,BLOCK_N=64,STAGES=6,BIAS=1,ACT=4,RESIDUAL=1 | DTYPE=0,BLOCK_N=128,STAGES=2,BIAS=1,ACT=1,RESIDUAL=0
// STOF_VARIANTS: DTYPE=1,BLOCK_N=256,STAGES=3,BIAS=0,ACT=4,RESIDUAL=0,GATED=1
// STOF_VARIANTS: DTYPE=0,BLOCK_N=128,STAGES=4,BIAS=1,ACT=2,RESIDUAL=1,GATED=1
// STOF_VARIANTS: DTYPE=0,BLOCK_N=128,STAGES=4,BIAS=1,ACT=2,PINGPONG=1 | DTYPE=1,BLOCK_N=128,STAGES=5,BIAS=1,ACT=1,RESIDUAL=1,PINGPONG=1
// STOF_VARIANTS: DTYPE=0,BLOCK_N=256,STAGES=3,BIAS=1,ACT=4,RESIDUAL=1 | DTYPE=1,BLOCK_N=256,STAGES=4,ACT=1,GATED=1,CLUSTER=2
// STOF_VARIANTS: DTYPE=1,BLOCK_N=64,STAGES=6,RESIDUAL=1,PINGPONG=1
// STOF_VARIANTS: DTYPE=1,BLOCK_N=128,STAGES=4,ACT=4,GATED=1,PINGPONG=1
// STOF_VARIANTS: DTYPE=0,BLOCK_N=256,STAGES=3,BIAS=1,ACT=2,CLUSTER=2 | DTYPE=1,BLOCK_N=64,STAGES=6,RESIDUAL=1,PINGPONG=1,CLUSTER=2
// STOF_VARIANTS: DTYPE=1,BLOCK_N=256,STAGES=3,ACT=4,GATED=1,CLUSTER=2 | DTYPE=0,BLOCK_N=128,STAGES=4,BIAS=1,ACT=2,GATED=1,PINGPONG=1,CLUSTER=2
// STOF_VARIANTS: DTYPE=0,BLOCK_N=256,STAGES=3,BIAS=1,RESIDUAL=1,NORM=1,N_TOTAL=768 | DTYPE=1,BLOCK_N=128,STAGES=4,RESIDUAL=1,NORM=2,WRITE_PRE=1,N_TOTAL=1000
// STOF_VARIANTS: DTYPE=0,BLOCK_N=256,STAGES=2,BIAS=1,NORM=1,WRITE_PRE=1,N_TOTAL=4096 | DTYPE=0,BLOCK_N=128,STAGES=5,BIAS=1,RESIDUAL=1,NORM=1,PINGPONG=1,N_TOTAL=768
// STOF_VARIANTS: DTYPE=1,BLOCK_N=128,STAGES=4,RESIDUAL=1,NORM=2,WRITE_PRE=1,PINGPONG=1,N_TOTAL=1000
// STOF_VARIANTS: DTYPE=0,BLOCK_N=192,STAGES=4,BIAS=1,RESIDUAL=1,NORM=1,N_TOTAL=768 | DTYPE=1,BLOCK_N=192,STAGES=3,BIAS=1,ACT=2
// STOF_VARIANTS: DTYPE=0,BLOCK_N=64,STAGES=6,BIAS=1,RESIDUAL=1,NORM=1,N_TOTAL=768 | DTYPE=1,BLOCK_N=64,STAGES=6,RESIDUAL=1,NORM=2,WRITE_PRE=1,PINGPONG=1,N_TOTAL=1000
// STOF_VARIANTS: DTYPE=0,BLOCK_N=192,STAGES=4,BIAS=1,RESIDUAL=1,NORM=1,N_TOTAL=768,GW_TRACE=1 | DTYPE=0,BLOCK_N=64,STAGES=6,GW_TRACE=1
// STOF_VARIANTS: DTYPE=0,BLOCK_N=256,STAGES=4,BIAS=1,RESIDUAL=1,NORM=1,N_TOTAL=1024,CSLOT=1 | DTYPE=1,BLOCK_N=128,STAGES=6,RESIDUAL=1,CSLOT=1
// STOF_VARIANTS: DTYPE=0,BLOCK_N=192,STAGES=5,BIAS=1,NORM=2,WRITE_PRE=1,N_TOTAL=768,CSLOT=1 | DTYPE=1,BLOCK_N=256,STAGES=4,BIAS=1,RESIDUAL=1,CSLOT=1
// STOF_VARIANTS: DTYPE=0,BLOCK_N=64,STAGES=6,BIAS=1,RESIDUAL=1,NORM=1,N_TOTAL=768,CSLOT=1 | DTYPE=1,BLOCK_N=128,STAGES=2,RESIDUAL=1,NORM=1,WRITE_PRE=1,N_TOTAL=1000,CSLOT=1
// STOF_VARIANTS: DTYPE=0,BLOCK_N=256,STAGES=4,BIAS=1,ROPE=128,ROPE_HD=128 | DTYPE=1,BLOCK_N=128,STAGES=5,PINGPONG=1,ROPE=32,ROPE_HD=64
// STOF_VARIANTS: DTYPE=0,BLOCK_N=256,STAGES=3,CLUSTER=2,ROPE=64,ROPE_HD=64 | DTYPE=1,BLOCK_N=192,STAGES=4,BIAS=1,ROPE=96,ROPE_HD=96
#include "sm90_common.cuh"
#include "gemm_epi.cuh"

#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef GATED
#define GATED 0
#endif
#ifndef PINGPONG
#define PINGPONG 0
#endif
#ifndef CLUSTER
#define CLUSTER 1
#endif
#ifndef NORM
#define NORM 0
#endif
#ifndef WRITE_PRE
#define WRITE_PRE 0
#endif
#ifndef N_TOTAL
#define N_TOTAL 0
#endif
#ifndef GW_TRACE
#define GW_TRACE 0
#endif
#ifndef CSLOT
#define CSLOT 0
#endif
#ifndef ROPE
#define ROPE 0
#endif
#ifndef ROPE_HD
#define ROPE_HD 0
#endif

#define GW_BM 128                          // tile rows (two warpgroups)
#define GW_BK 64                           // K per stage (128-byte rows)
#define GW_GROUP_M 8                       // tile rows per raster group
#define GW_A_BYTES (GW_BM * GW_BK * 2)
#define GW_W_BYTES (BLOCK_N * GW_BK * 2)
#define GW_STAGE_BYTES (GW_A_BYTES + GW_W_BYTES)
#define GW_OFF_C (STAGES * GW_STAGE_BYTES)  // the C tile, staged
#define GW_ON (GATED ? BLOCK_N / 2 : BLOCK_N) // C tile columns
#define GW_HB (BLOCK_N / 16)               // GATED: up block of block 0
#define GW_HALVES (PINGPONG ? 2 : 1)       // 64-row halves a warpgroup owns
#define GW_WG_ROWS (64 * GW_HALVES)
#define GW_UNITS (GW_HALVES * GW_ON / 64)  // C units (64 x 64) a tile
// C units staged a warpgroup: a ring of 2, or (RESIDUAL, NORM) a whole
// tile's units (at most 4), into which the residual is loaded by TMA;
// none with CSLOT (below)
#define GW_CBUF (RESIDUAL || NORM ? 4 : 2)
#define GW_C_BYTES (CSLOT ? 0 : 2 * GW_CBUF * 64 * 128) // both warpgroups'
// CSLOT (RESIDUAL or NORM; both warpgroups on each tile, no pairs): a
// tile's C units take the pipeline's slots instead of a ring of their
// own, GW_NCS slots after the tile's K-steps (the producer loads the
// residual there as if they were K-steps); so 128 x 256 keeps four
// stages (three with a ring of 64 KB), 128 x 192 five, 128 x 128 six.
// Warpgroup cw's GW_ON / 64 units: slot 0 after its half's (NCS 1: one
// slot holds the whole tile), or slot cw (NCS 2).
#define GW_UPS (GW_STAGE_BYTES / (64 * 128)) // C units a slot holds
#define GW_NCS (!CSLOT ? 0 : 2 * (GW_ON / 64) <= GW_UPS ? 1 : 2)
#define GW_OFF_BAR (GW_OFF_C + GW_C_BYTES)
#define GW_NBAR (2 * STAGES + 4)           // mbarriers
#define GW_NC (NORM ? (N_TOTAL + BLOCK_N - 1) / BLOCK_N : 1) // tiles a row
#define GW_OFF_GB (GW_OFF_BAR + 8 * GW_NBAR) // NORM: gamma, beta (fp32)
// NORM: row counters a tile row, one a warp's 16 rows (WG_ROW_SLICES in
// src/kernels/gemm.h), and the words they take in ws (256-byte padded)
#define GW_SLICES 8
#define GW_CTR_WORDS(tiles_m) ((((unsigned)(tiles_m)) * GW_SLICES + 63u) & ~63u)
// NORM: a thread loads all its rows' statistics words at once (one round
// trip) unless, with its accumulators and bias pairs, they would take
// more registers than are left (ptxas: 128 x 256 tiles over 16 tiles a
// row, and 128 x 64 ping-pong over 16, spilled), then a row pair's words
// at a time.
#define GW_WORDS_AT_ONCE                                                    \
    (GW_HALVES * GW_ACC + 4 * GW_HALVES * GW_NC + BLOCK_N / 8 <= 192)
#define GW_ACC (BLOCK_N / 2)               // accumulators per thread
#define GW_RC 8                            // residual 8-column blocks a pass
#define GW_AB 2                            // 8-column blocks an activation pass
#define GW_WH (BLOCK_N / CLUSTER)          // W rows one producer loads
// Split tails (ping-pong tiles alone, no norm): when the last round of a
// launch would leave at least half of the CTAs idle (tiles = R x grid + r,
// 0 < r <= grid / 2), the host numbers the last r tiles as 2 r items of
// 64 rows each (n_items, split_from; stof__gemm_split_from), so that the
// last round takes half a tile's K loop instead of a whole one. A half
// loads 64 rows of A (tm_ah: the K-steps of the last round then move
// 24 KB for 64 x 128 x 64 instead of 32 KB for 128 x 128 x 64, and the
// round has only r <= grid / 2 tiles' worth of them in flight) and its
// warpgroup runs the K loop and the epilogue of one 64-row half. Measured
// (H200, fp16, test_gpu_gemm bench_split, split on / off alternating):
// BERT-base's QKV, 4096 x 2304 x 768 (576 tiles on 132 SMs, 4.5 rounds
// instead of 5), 0.936 of the time with bias, 0.923 with erf-GELU; at
// 2048 tokens 0.87-0.89; at 16384 0.97-0.99; 768 tiles (no split) 1.00.
#define GW_SPLIT (PINGPONG && CLUSTER == 1 && !NORM)
#define GW_AH_BYTES (64 * GW_BK * 2)       // a half's A a K-step

static_assert(BLOCK_N == 64 || BLOCK_N == 128 || BLOCK_N == 192 ||
                  BLOCK_N == 256,
              "BLOCK_N must be 64, 128, 192 or 256");
static_assert(BLOCK_N != 192 || (!GATED && CLUSTER == 1),
              "BLOCK_N 192: not gated (96 output columns) nor in pairs");
static_assert(STAGES >= 2 && STAGES <= 6, "STAGES must be 2..6");
static_assert(!GATED || BLOCK_N >= 128, "GATED needs BLOCK_N 128 or 256");
static_assert(!PINGPONG || BLOCK_N <= 128,
              "PINGPONG: 128 x BLOCK_N accumulators a thread, BLOCK_N <= 128");
static_assert((GW_ON / 8) % GW_RC == 0, "GW_RC must divide the C tile / 8");
static_assert(GW_RC == 8, "a C unit is 64 columns: GW_RC blocks of 8");
static_assert(!RESIDUAL || GW_UNITS <= GW_CBUF,
              "RESIDUAL: a tile's C units must fit the ring");
static_assert(GW_RC % GW_AB == 0, "GW_AB must divide GW_RC");
static_assert(CLUSTER == 1 || CLUSTER == 2, "CLUSTER must be 1 or 2");
static_assert(!(GATED && CLUSTER == 2) || GW_WH == GW_ON,
              "GATED pairs: one half of the W tile each");
static_assert(GW_STAGE_BYTES % 1024 == 0,
              "swizzle atoms must stay 1024-byte aligned");
static_assert(NORM >= 0 && NORM <= 2, "NORM must be 0, 1 or 2");
static_assert(!NORM || (N_TOTAL > 0 && N_TOTAL % 8 == 0 && GW_NC <= 16),
              "NORM needs N_TOTAL, a multiple of 8, of at most 16 tiles");
static_assert(!NORM || (ACT == 0 && !GATED && CLUSTER == 1),
              "NORM: no activation, gate or pairs");
static_assert(!WRITE_PRE || NORM, "WRITE_PRE needs NORM");
static_assert(!ROPE || (ROPE % 16 == 0 && ROPE <= ROPE_HD &&
                        ROPE_HD % 8 == 0 && BLOCK_N % ROPE_HD == 0 &&
                        ACT == 0 && !GATED && !RESIDUAL && !NORM),
              "ROPE: a multiple of 16 <= ROPE_HD, whole heads in a tile, "
              "no activation, gate, residual or norm");
static_assert(!CSLOT || ((RESIDUAL || NORM) && !PINGPONG && CLUSTER == 1 &&
                         GW_ON / 64 <= GW_UPS),
              "CSLOT: a residual or a norm, not ping-pong, no pairs");

// The launch parameters, by value (__grid_constant__: the tensor maps are
// read in place). Mirrored by stof_gemm_wgmma_params in
// src/kernels/gemm_launch.c; both sides check the size.
struct stof_gemm_wgmma_params {
    stof_tmap tm_a, tm_w;            // (K, M) and (K, N) maps, box 64 wide
                                     // (GATED: (K, 2N), box 64 x BLOCK_N/2)
    stof_tmap tm_c;                  // (N, M) map of C, box 64 x 64
    stof_tmap tm_r;                  // RESIDUAL: the same over residual
    stof_tmap tm_p;                  // WRITE_PRE: the same over pre
    unsigned short *c;               // output, ldc elements per row
    const unsigned short *bias;      // BIAS: [N]
    const unsigned short *residual;  // RESIDUAL: [M][ldc]
    const unsigned short *gamma;     // NORM: [N]
    const unsigned short *beta;      // NORM 1: [N]
    stof_i64 ldc;
    int M, N, K;
    int tiles_m, tiles_n;
    float eps;                       // NORM
    unsigned *ws;                    // NORM: the row counters
                                     // [tiles_m][GW_SLICES] (256-byte
                                     // padded), then the tiles' statistics
                                     // [tiles_m][GW_NC][128] (float2)
    int n_items, split_from;         // GW_SPLIT: the raster's items; those
                                     // from split_from on are 64-row halves
    const float4 *rope_tab;          // ROPE: (cos, sin) [rope_seq][ROPE/2]
    int rope_seq, rope_cols;         // ROPE: positions m % rope_seq; the
                                     // rotated columns [0, rope_cols)
    unsigned char tail_[24];         // to 768 bytes (64-byte aligned)
    stof_tmap tm_ah;                 // GW_SPLIT: A again, box 64 x 64 rows
                                     // (896 bytes on both sides)
};
static_assert(sizeof(stof_gemm_wgmma_params) == 896,
              "stof_gemm_wgmma_params layout");

// GW_TRACE (a diagnostic build, never a search candidate): when the
// module's stof_gw_trace is set, CTA x stamps its phases at
// stof_gw_trace[16 x + k] (k: 0 entry, 1 entry's global timer (ns), 2
// barriers set up, 3 first load issued, 4 first K-step's data seen, 5 K
// loop done, 11 bias and residual added, 12 row statistics computed and
// stored, 13 the row's received, 8 last store issued, 9 stores read,
// 10 the end's global timer; the SM clock but 1 and 10; 4.. by the first
// consumer warpgroup, of its last tile). Stamps 0 and 1 are written
// before stof_grid_wait: a traced launch must not follow a programmatic
// launch that reads its trace. With PDL, "setup" includes that wait.
#if GW_TRACE
__device__ unsigned long long *stof_gw_trace;
__device__ __forceinline__ void gw_stamp(int k, int global)
{
    unsigned long long *t = stof_gw_trace;
    if (!t)
        return;
    unsigned long long v;
    if (global)
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
    else
        asm volatile("mov.u64 %0, %%clock64;" : "=l"(v));
    t[blockIdx.x * 16u + (unsigned)k] = v;
}
#define GW_T(k) gw_stamp((k), 0)
#define GW_TG(k) gw_stamp((k), 1)
#else
#define GW_T(k) ((void)0)
#define GW_TG(k) ((void)0)
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The raster's rows: tile rows, or (CLUSTER 2) pairs of them.
__device__ __forceinline__ int gw_rows(const stof_gemm_wgmma_params &p)
{
    return (p.tiles_m + CLUSTER - 1) / CLUSTER;
}

// Item t of the raster (a tile, or a pair of tiles of one column; NORM:
// tiles row by row): this CTA's tile row (rank: its place in the pair)
// and column.
__device__ __forceinline__ void gw_tile(const stof_gemm_wgmma_params &p,
                                        int t, int rank, int &tm, int &tn)
{
#if NORM
    (void)rank;
    tm = t / GW_NC;
    tn = t % GW_NC;
    return;
#endif
    const int group = GW_GROUP_M / CLUSTER;
    const int per_group = group * p.tiles_n;
    const int first = (t / per_group) * group;
    const int rows = min(gw_rows(p) - first, group);
    const int r = t % per_group;
    tm = (first + r % rows) * CLUSTER + rank;
    tn = r / rows;
}

// A compile-time int as a value (the K loop's count of halves).
template <int N> struct gw_ic {
    static constexpr int value = N;
};

// Item t of the launch: its tile (gw_tile) and, for a split tail's
// item, which 64-row half of it (hs 0 or 1; -1: the whole tile).
__device__ __forceinline__ void gw_item(const stof_gemm_wgmma_params &p,
                                        int t, int rank, int &tm, int &tn,
                                        int &hs)
{
    hs = -1;
#if GW_SPLIT
    if (t >= p.split_from) {
        hs = (t - p.split_from) & 1;
        t = p.split_from + ((t - p.split_from) >> 1);
    }
#endif
    gw_tile(p, t, rank, tm, tn);
}

__device__ __forceinline__ unsigned gw_ldg_u32(const unsigned short *p)
{
    unsigned v;
    asm volatile("ld.global.nc.b32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
}

// One K-step: acc (+)= A rows of this warpgroup x W^T over 64 of K.
__device__ __forceinline__ void gw_kstep(float (&acc)[GW_ACC], stof_u64 da,
                                         stof_u64 dw, int first)
{
#pragma unroll
    for (int kk = 0; kk < GW_BK / 16; kk++)
        wg_mma_ss(acc, da + (stof_u64)(kk * 2), dw + (stof_u64)(kk * 2),
                  !(first && kk == 0));
}

#if NORM
// The columns of tile column r that lie inside N.
__device__ __forceinline__ constexpr int gw_cols(int r)
{
    return N_TOTAL - r * BLOCK_N < BLOCK_N ? N_TOTAL - r * BLOCK_N : BLOCK_N;
}

// A tile's statistics of one row, (s, m2), are one 64-bit word in ws,
// stored with its bits inverted: the workspace's zeros mean "not written
// yet", and a written word is never zero (s's all-ones NaN is stored as
// another NaN). So the word is its own flag: a reader polls the words it
// needs, with no release or acquire (nothing else is read through them).
__device__ __forceinline__ void gw_put_stat(float2 *at, float s, float m2)
{
    unsigned a = __float_as_uint(s);
    if (a == 0xffffffffu)
        a = 0x7fffffffu;
    const unsigned long long w =
        ((unsigned long long)~__float_as_uint(m2) << 32) | (unsigned)~a;
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;\n" ::"l"(at), "l"(w)
                 : "memory");
}

__device__ __forceinline__ unsigned long long gw_get_stat(const float2 *at)
{
    unsigned long long w;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n"
                 : "=l"(w)
                 : "l"(at)
                 : "memory");
    return w;
}

// Combine a row's GW_NC tile statistics st[r] = (s, m2) (NORM 1: the
// tile's sum and its sum of squares about the tile's mean; NORM 2: the
// sum of squares), in tile order: the row's mean (0 for NORM 2) and rstd.
// NORM 1 by Chan et al.'s pairwise formula: M2 = sum of m2_r + (s_r -
// n_r mean)^2 / n_r over the tiles. 0 while a tile's word is unwritten.
__device__ __forceinline__ bool gw_combine(const float2 *st, float eps,
                                          float &mean, float &rstd)
{
    float2 v[GW_NC];
    bool ok = true;
#pragma unroll
    for (int r = 0; r < GW_NC; r++) {
        const unsigned long long w = gw_get_stat(st + r * 128);
        ok = ok && w != 0ull;
        v[r] = make_float2(__uint_as_float(~(unsigned)w),
                           __uint_as_float(~(unsigned)(w >> 32)));
    }
    float t = 0.0f;
#pragma unroll
    for (int r = 0; r < GW_NC; r++)
        t += v[r].x;
#if NORM == 1
    mean = t * (1.0f / (float)N_TOTAL);
    float q = 0.0f;
#pragma unroll
    for (int r = 0; r < GW_NC; r++) {
        const float d = v[r].x - (float)gw_cols(r) * mean;
        q += v[r].y + d * d * (1.0f / (float)gw_cols(r));
    }
    rstd = rsqrtf(q * (1.0f / (float)N_TOTAL) + eps);
#else
    mean = 0.0f;
    rstd = rsqrtf(t * (1.0f / (float)N_TOTAL) + eps);
#endif
    return ok;
}

// A reader has the words of a warp's rows: one arrival on their counter,
// relaxed (no fence to wait for). The old value.
__device__ __forceinline__ unsigned gw_arrive_relaxed(unsigned *ctr)
{
    unsigned old;
    asm volatile("atom.add.relaxed.gpu.global.u32 %0, [%1], 1;\n"
                 : "=r"(old)
                 : "l"(ctr)
                 : "memory");
    return old;
}

// The sum over the quad (the 4 threads holding a row's columns).
__device__ __forceinline__ float gw_quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
#endif

// The address lane `lane` gives ldmatrix / stmatrix for the four 8 x 8
// fragments [2 jj + hh] of a 64 x 64 C unit at s_u (128-byte swizzle):
// rows lr (row lane % 8 of fragment lane / 8, in the warp's 16) of the
// 8-column blocks j and j + 1 (j: the pass's first block in the unit's
// row of blocks, mod 8).
__device__ __forceinline__ unsigned gw_frag_addr(unsigned s_u, int lr, int j,
                                                 int lane)
{
    return s_u + lr * 128 + ((((j + (lane >> 4)) & 7) ^ (lr & 7)) << 4);
}

// v[2 f], v[2 f + 1] += fragment f of the unit at m_addr (the residual,
// loaded there by TMA): [4 jj + 2 hh + c] in the accumulators' order.
__device__ __forceinline__ void gw_add_frags(float (&v)[8], unsigned m_addr)
{
    unsigned rr[4];
    ld_matrix4(m_addr, rr[0], rr[1], rr[2], rr[3]);
#pragma unroll
    for (int f = 0; f < 4; f++) {
        v[2 * f] += gm_lo(rr[f]);
        v[2 * f + 1] += gm_hi(rr[f]);
    }
}

// Warpgroup cw's C units may be written again: its thread 0 waits until
// all but the newest N of its stores have read theirs, then the whole
// warpgroup passes a barrier.
template <int N>
__device__ __forceinline__ void gw_units_read(int cw, int ctid)
{
    if (ctid == 0)
        bulk_wait_read<N>();
    named_bar_sync(1 + cw, 128);
}

// The C unit at s_u, just written by warpgroup cw's threads, seen by the
// TMA (async proxy), then stored by one thread to (c0, c1) of map m (the
// map clips rows and columns outside it), in its current bulk group.
__device__ __forceinline__ void gw_store_unit(const stof_tmap *m, int c0,
                                              int c1, unsigned s_u, int cw,
                                              int ctid)
{
    fence_proxy_async();
    named_bar_sync(1 + cw, 128);
    if (ctid == 0) {
        tma_store2(m, c0, c1, s_u);
        bulk_commit();
    }
}

// A consumer warp is done with a slot: in every CTA whose producer writes
// into it.
__device__ __forceinline__ void gw_release(unsigned empty_bar)
{
    mb_arrive(empty_bar);
#if CLUSTER > 1
    mb_arrive_rank(empty_bar, cluster_rank() ^ 1u);
#endif
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

extern "C" __global__ void __launch_bounds__(384, 1)
stof_gemm_wgmma(const __grid_constant__ stof_gemm_wgmma_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char gw_smem_raw[];
    const unsigned raw = stof_smem_addr(gw_smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    const unsigned bar = base + GW_OFF_BAR;
#define GW_FULL(s) (bar + 8u * (s))
#define GW_EMPTY(s) (bar + 8u * (STAGES + (s)))
#define GW_ORDER(c) (bar + 8u * (2 * STAGES + (c)))
#define GW_RES(c) (bar + 8u * (2 * STAGES + 2 + (c)))
#define GW_SA(s) (base + (s) * GW_STAGE_BYTES)
#define GW_SW(s) (base + (s) * GW_STAGE_BYTES + GW_A_BYTES)

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2;
    // Raster items (tiles, or pairs) and this CTA's walk over them.
    const int n_tiles = NORM       ? p.tiles_m * GW_NC
                        : GW_SPLIT ? p.n_items
                                   : gw_rows(p) * p.tiles_n;
    const int kt_n = (p.K + GW_BK - 1) / GW_BK;
#if CLUSTER > 1
    const int rank = (int)cluster_rank();
#else
    const int rank = 0;
#endif
    const int t0 = blockIdx.x / CLUSTER, t_step = gridDim.x / CLUSTER;

    // The tensor maps' descriptors on their way first (the launch's own
    // parameters, not memory an earlier kernel writes): fetched when the
    // first load needs them, they took the producer ~500 cycles after the
    // setup (H100, GW_TRACE).
    if (tid == 32) {
        tma_prefetch_map(&p.tm_a);
        tma_prefetch_map(&p.tm_w);
        if (GW_SPLIT && p.split_from < p.n_items)
            tma_prefetch_map(&p.tm_ah);
    } else if (tid == 64) {
        tma_prefetch_map(&p.tm_c);
        if (RESIDUAL)
            tma_prefetch_map(&p.tm_r);
        if (WRITE_PRE)
            tma_prefetch_map(&p.tm_p);
    }
    if (tid == 0) {
        GW_T(0);
        GW_TG(1);
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            mb_init(GW_FULL(s), 1);
            mb_init(GW_EMPTY(s), (PINGPONG ? 4 : 8) * CLUSTER);
        }
        mb_init(GW_ORDER(0), 1);
        mb_init(GW_ORDER(1), 1);
        mb_init(GW_RES(0), 1);
        mb_init(GW_RES(1), 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // The peer's multicasts and arrivals target these barriers: both
    // CTAs' are initialised first.
#if CLUSTER > 1
    cluster_sync();
#else
    __syncthreads();
#endif
    // Nothing above touched global memory (programmatic dependent launch:
    // see stof_common.cuh).
    stof_grid_wait();
    stof_grid_release();
    if (tid == 0)
        GW_T(2);

    if (wg == 0) {
        // ------------------------------------------------------------------
        // Producer
        // ------------------------------------------------------------------
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid == 0) {
#if GW_TRACE
            int traced = 0;
#endif
            int s = 0, gk = 0; // slot; K-steps loaded so far
            unsigned ph = 0;
            for (int t = t0; t < n_tiles; t += t_step) {
                int tm, tn, hs;
                gw_item(p, t, rank, tm, tn, hs);
                for (int kt = 0; kt < kt_n; kt++, gk++) {
                    if (gk >= STAGES)
                        mb_wait(GW_EMPTY(s), ph ^ 1u);
                    if (GW_SPLIT && hs >= 0) { // a half: its 64 rows of A
                        mb_expect_tx(GW_FULL(s),
                                     GW_STAGE_BYTES - GW_A_BYTES +
                                         GW_AH_BYTES);
                        tma_load2(GW_SA(s), &p.tm_ah, kt * GW_BK,
                                  tm * GW_BM + 64 * hs, GW_FULL(s));
                    } else {
                        mb_expect_tx(GW_FULL(s), GW_STAGE_BYTES);
                        tma_load2(GW_SA(s), &p.tm_a, kt * GW_BK, tm * GW_BM,
                                  GW_FULL(s));
                    }
#if GW_TRACE
                    if (!traced++)
                        GW_T(3);
#endif
#if CLUSTER > 1
                    // This CTA's half of the pair's W tile, into both.
                    tma_load2_mc(GW_SW(s) + rank * (GW_WH * 128), &p.tm_w,
                                 kt * GW_BK,
                                 GATED ? rank * p.N + tn * GW_ON
                                       : tn * BLOCK_N + rank * GW_WH,
                                 GW_FULL(s), (unsigned short)3u);
#elif GATED
                    tma_load2(GW_SW(s), &p.tm_w, kt * GW_BK, tn * GW_ON,
                              GW_FULL(s));
                    tma_load2(GW_SW(s) + GW_ON * 128, &p.tm_w, kt * GW_BK,
                              p.N + tn * GW_ON, GW_FULL(s));
#else
                    tma_load2(GW_SW(s), &p.tm_w, kt * GW_BK, tn * BLOCK_N,
                              GW_FULL(s));
#endif
                    if (++s == STAGES) {
                        s = 0;
                        ph ^= 1u;
                    }
                }
#if CSLOT
                // The tile's C slots: free once both warpgroups have
                // released their last K-steps (and an earlier tile's
                // stores have read them); the residual's units loaded
                // there, or (no residual) an arrival that hands them over.
                for (int j = 0; j < GW_NCS; j++, gk++) {
                    if (gk >= STAGES)
                        mb_wait(GW_EMPTY(s), ph ^ 1u);
#if RESIDUAL
                    constexpr int UH = GW_ON / 64;
                    constexpr int NU = GW_NCS == 1 ? 2 * UH : UH;
                    mb_expect_tx(GW_FULL(s), NU * 64 * 128);
#pragma unroll
                    for (int q = 0; q < NU; q++) {
                        const int c = GW_NCS == 1 ? q / UH : j; // warpgroup
                        tma_load2(GW_SA(s) + q * (64 * 128), &p.tm_r,
                                  tn * GW_ON + (q % UH) * 64,
                                  tm * GW_BM + 64 * c, GW_FULL(s));
                    }
#else
                    mb_arrive(GW_FULL(s));
#endif
                    if (++s == STAGES) {
                        s = 0;
                        ph ^= 1u;
                    }
                }
#endif
            }
        }
    } else {

    // ----------------------------------------------------------------------
    // Consumers
    // ----------------------------------------------------------------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int cw = wg - 1;            // consumer warpgroup 0 or 1
    const int wl = warp & 3;          // 16-row slice of each 64 rows
    const int ctid = tid & 127;       // thread in the warpgroup
    const int g = lane >> 2, tq = lane & 3;
    // This warpgroup's rows of a tile: 64 cw .. 64 cw + 63, or (PINGPONG)
    // all 128 in two halves.
    const int wg_row0 = PINGPONG ? 0 : 64 * cw;
    float acc[GW_HALVES][GW_ACC];
    int s = 0;
    unsigned cu = 0; // C units this warpgroup has staged
#if RESIDUAL && !CSLOT
    unsigned res_ph = 0; // phase of GW_RES(cw)
#endif
#if NORM
    // gamma and beta of this CTA's columns (the same in every tile it
    // takes: gridDim.x is a multiple of GW_NC) into shared memory, zeros
    // past N.
    // In fp32: the normalisation reads them without conversions.
    float2 *const gb = (float2 *)(gw_smem_raw + (base - raw) + GW_OFF_GB);
    for (int i = tid - 128; i < BLOCK_N / 2; i += 256) {
        const int col = (int)(blockIdx.x % GW_NC) * BLOCK_N + 2 * i;
        const unsigned g2 = col < p.N ? gw_ldg_u32(p.gamma + col) : 0u;
        const unsigned b2 =
            NORM == 1 && col < p.N ? gw_ldg_u32(p.beta + col) : 0u;
        gb[i] = make_float2(gm_lo(g2), gm_hi(g2));
        gb[BLOCK_N / 2 + i] = make_float2(gm_lo(b2), gm_hi(b2));
    }
    named_bar_sync(3, 256);
#endif
    unsigned ph = 0;
#if PINGPONG
    // The CTA's i-th tile goes to warpgroup i % 2; its K-steps are the
    // producer's i * kt_n .. (i + 1) * kt_n - 1.
    int i = cw;
    for (int t = t0 + cw * t_step; t < n_tiles; t += 2 * t_step, i += 2) {
        s = (i * kt_n) % STAGES;
        ph = (unsigned)((i * kt_n) / STAGES) & 1u;
#else
    for (int t = t0; t < n_tiles; t += t_step) {
#endif
        int tm, tn, hs;
        gw_item(p, t, rank, tm, tn, hs);
        // The 64-row halves of acc this item fills, and the tile row of
        // half h's first row.
        const int nh = GW_SPLIT && hs >= 0 ? 1 : GW_HALVES;
#define GW_HROW(h) (GW_SPLIT && hs >= 0 ? 64 * hs : wg_row0 + 64 * (h))
#if BIAS
        // This thread's bias pairs, loaded now: their latency passes under
        // the K loop (loaded in the epilogue, each would wait behind the
        // stores before it, which the compiler cannot reorder).
        unsigned bias_r[BLOCK_N / 8];
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; j++) {
#if GATED
            // Blocks GW_HB.. hold the up projection's columns.
            const int col = tn * GW_ON + 8 * (j % GW_HB) + 2 * tq;
            bias_r[j] = col < p.N ? gw_ldg_u32(p.bias + col +
                                               (j >= GW_HB ? p.N : 0))
                                  : 0u;
#else
            const int col = tn * BLOCK_N + 8 * j + 2 * tq;
            bias_r[j] = col < p.N ? gw_ldg_u32(p.bias + col) : 0u;
#endif
        }
#endif
#if PINGPONG
        // The other warpgroup's K loop of tile i - 1 has passed all its
        // waits (so every earlier phase of the slots has completed, and
        // parity waits below cannot alias): the two K loops take turns on
        // the tensor cores while the other warpgroup runs its epilogue.
        if (i > 0)
            mb_wait(GW_ORDER(cw ^ 1), (unsigned)((i - 1) >> 1) & 1u);
#endif
        // The K loop over NH 64-row halves of acc, straight-line (a
        // wgmma under a run-time condition makes ptxas serialise every
        // wgmma of the kernel): a split tail's half runs the one-half
        // copy. Returns the slot of the last K-step.
        auto kloop = [&](auto nh_c) {
            constexpr int NH = decltype(nh_c)::value;
            int prev = 0;
            for (int kt = 0; kt < kt_n; kt++) {
                mb_wait(GW_FULL(s), ph);
                if (tid == 128 && kt == 0)
                    GW_T(4);
                wg_fence();
                // (A half's 64 rows of A are the slot's first 64.)
#pragma unroll
                for (int h = 0; h < NH; h++)
                    gw_kstep(acc[h],
                             wg_desc(GW_SA(s) + (wg_row0 + 64 * h) * 128, 16,
                                     1024),
                             wg_desc(GW_SW(s), 16, 1024), kt == 0);
                wg_commit();
#if RESIDUAL && !CSLOT
                // The tile's residual units into its C units (free once
                // the previous tile's stores have read them, long done by
                // now): their latency passes under the rest of the K loop.
                if (ctid == 0 && kt == min(2, kt_n - 1)) {
                    bulk_wait_read<0>();
                    mb_expect_tx(GW_RES(cw), NH * (GW_ON / 64) * 64 * 128);
#pragma unroll
                    for (int h = 0; h < NH; h++)
#pragma unroll
                        for (int cb = 0; cb < GW_ON / 64; cb++)
                            tma_load2(base + GW_OFF_C +
                                          (cw * GW_CBUF +
                                           (cu + h * (GW_ON / 64) + cb) %
                                               GW_CBUF) *
                                              (64 * 128),
                                      &p.tm_r, tn * GW_ON + cb * 64,
                                      tm * GW_BM + GW_HROW(h), GW_RES(cw));
                }
#endif
                if (kt > 0) {
                    wg_wait<1>(); // K-step kt-1 has retired: free its slot
                    __syncwarp();
                    if (lane == 0)
                        gw_release(GW_EMPTY(prev));
                }
                prev = s;
                if (++s == STAGES) {
                    s = 0;
                    ph ^= 1u;
                }
            }
            return prev;
        };
        const int prev = GW_SPLIT && nh == 1 ? kloop(gw_ic<1>())
                                              : kloop(gw_ic<GW_HALVES>());
#if PINGPONG
        if (ctid == 0)
            mb_arrive(GW_ORDER(cw));
#endif
        wg_wait<0>();
        if (tid == 128)
            GW_T(5);
#pragma unroll
        for (int h = 0; h < GW_HALVES; h++)
            wg_keep(acc[h]);
        __syncwarp();
        if (lane == 0)
            gw_release(GW_EMPTY(prev));
#if CSLOT
        // This tile's C slots follow its K-steps: this warpgroup's units
        // at s_c (in place of the ring), there once the producer has
        // handed them over (with the residual's units loaded).
        const int cs0 = s;
        unsigned s_c;
        {
            const int my = GW_NCS == 2 && cw == 1 ? (s + 1) % STAGES : s;
            s_c = GW_SA(my) + (GW_NCS == 1 ? cw * (GW_ON / 64) : 0) *
                                  (64u * 128u);
            // Every slot's hand-over, the other warpgroup's too: a
            // parity wait must see each phase of a barrier (waiting for
            // a slot's next K-step while its C phase is still open would
            // return at once), and an arrival below on a slot whose data
            // this warpgroup waited for cannot complete an earlier phase.
            for (int j = 0; j < GW_NCS; j++) {
                mb_wait(GW_FULL(s), ph);
                if (++s == STAGES) {
                    s = 0;
                    ph ^= 1u;
                }
            }
        }
        const unsigned cu0 = cu;
        // C unit k of this warpgroup's tile (its ring's place otherwise)
#define GW_UNIT(k) (s_c + (unsigned)((k) - cu0) * (64u * 128u))
#else
#define GW_UNIT(k) (s_c + (unsigned)((k) % GW_CBUF) * (64u * 128u))
#endif

#if NORM
        // ---- row norm epilogue: (1) v = acc + bias (+ residual), rounded,
        // back into acc (WRITE_PRE: stored to pre through the C units);
        // (2) the rows' statistics through ws, the row's mean and rstd;
        // (3) the normalised rows through the C units to C. The units are
        // this warpgroup's four, in the ring's order (the residual's,
        // loaded during the K loop); each warp reads and writes only its
        // own 16 rows of each.
        {
#if !CSLOT
            const unsigned s_c =
                base + GW_OFF_C + cw * (GW_CBUF * 64 * 128);
#endif
            const int lr = wl * 16 + 8 * ((lane >> 3) & 1) + (lane & 7);
            constexpr int UH = GW_ON / 64; // C units a 64-row half
#if CSLOT
            // (the units were handed over above)
#elif RESIDUAL
            mb_wait(GW_RES(cw), res_ph);
            res_ph ^= 1u;
#elif WRITE_PRE
            // The previous tile's stores have read the units.
            gw_units_read<0>(cw, ctid);
#endif
#pragma unroll
            for (int h = 0; h < GW_HALVES; h++)
#pragma unroll
                for (int u = 0; u < UH; u++) {
                    const unsigned s_u = GW_UNIT(cu + h * UH + u);
#pragma unroll
                    for (int jb = 0; jb < GW_RC; jb += GW_AB) {
                        const int j = 8 * u + jb; // first 8-column block
                        float v[4 * GW_AB];
#pragma unroll
                        for (int i = 0; i < 4 * GW_AB; i++) {
                            v[i] = acc[h][4 * j + i];
#if BIAS
                            const unsigned b = bias_r[j + i / 4];
                            v[i] += (i & 1) ? gm_hi(b) : gm_lo(b);
#endif
                        }
                        const unsigned m_addr =
                            gw_frag_addr(s_u, lr, j, lane);
#if RESIDUAL
                        gw_add_frags(v, m_addr);
#endif
                        unsigned pk[4];
#pragma unroll
                        for (int f = 0; f < 4; f++) {
                            pk[f] = stof_pack2(v[2 * f], v[2 * f + 1]);
                            acc[h][4 * j + 2 * f] = gm_lo(pk[f]);
                            acc[h][4 * j + 2 * f + 1] = gm_hi(pk[f]);
                        }
#if WRITE_PRE
                        st_matrix4(m_addr, pk[0], pk[1], pk[2], pk[3]);
#endif
                    }
#if WRITE_PRE
                    gw_store_unit(&p.tm_p, tn * GW_ON + u * 64,
                                  tm * GW_BM + wg_row0 + 64 * h, s_u, cw,
                                  ctid);
#endif
                }
            if (tid == 128)
                GW_T(11);
            // (2) [4 j + 2 hh + c]: row g + 8 hh, column 8 j + 2 tq + c.
            // Columns past N hold zeros, not values: left out. One thread
            // of each quad writes its rows' (s, m2) to ws. Four partial
            // sums a row: the adds' latency, not their number, is the cost.
            float2 *const st_row =
                (float2 *)(p.ws + GW_CTR_WORDS(p.tiles_m)) +
                (size_t)tm * (GW_NC * 128) + wg_row0 + 16 * wl + g;
#pragma unroll
            for (int h = 0; h < GW_HALVES; h++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int j = 0; j < GW_ACC / 4; j++)
#pragma unroll
                        for (int c = 0; c < 2; c++) {
                            const float a = acc[h][4 * j + 2 * hh + c];
                            x[2 * (j & 1) + c] += NORM == 1 ? a : a * a;
                        }
                    const float s2 = gw_quad_sum((x[0] + x[1]) + (x[2] + x[3]));
                    float m2 = 0.0f;
#if NORM == 1
                    // The tile's own mean, then the squares about it.
                    const float mt = s2 * (1.0f / (float)gw_cols(tn));
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        x[e] = 0.0f;
#pragma unroll
                    for (int j = 0; j < GW_ACC / 4; j++)
#pragma unroll
                        for (int c = 0; c < 2; c++) {
                            const float d = acc[h][4 * j + 2 * hh + c] - mt;
                            if (N_TOTAL % BLOCK_N == 0 ||
                                tn * BLOCK_N + 8 * j + 2 * tq + c < N_TOTAL)
                                x[2 * (j & 1) + c] = fmaf(d, d, x[2 * (j & 1) + c]);
                        }
                    m2 = gw_quad_sum((x[0] + x[1]) + (x[2] + x[3]));
#endif
                    if (tq == 0)
                        gw_put_stat(st_row + tn * 128 + 64 * h + 8 * hh, s2,
                                    m2);
                }
            if (tid == 128)
                GW_T(12);
            // Wait for the same rows of the row's other tiles: lane i <
            // GW_NC x GW_HALVES polls the first row's word of tile i % GW_NC
            // (half i / GW_NC) until it is written (one sector a poll, not
            // the L2 traffic of every lane polling every word, which the
            // other CTAs' K loops need), then every lane loads its rows'
            // words, again while one is still zero (seeing one word of a
            // tile says nothing of its other rows' words, each stored by
            // its own lane there).
            float mean[GW_HALVES][2], rstd[GW_HALVES][2];
            if (lane < GW_NC * GW_HALVES) {
                const float2 *const w0 = st_row - g + (lane % GW_NC) * 128 +
                                         64 * (lane / GW_NC);
                while (gw_get_stat(w0) == 0ull)
                    __nanosleep(32);
            }
            __syncwarp();
#if GW_WORDS_AT_ONCE
            for (;;) {
                bool ok = true;
#pragma unroll
                for (int h = 0; h < GW_HALVES; h++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++)
                        ok = gw_combine(st_row + 64 * h + 8 * hh, p.eps,
                                        mean[h][hh], rstd[h][hh]) &&
                             ok;
                if (__all_sync(0xffffffffu, ok))
                    break;
                __nanosleep(32);
            }
#else
#pragma unroll
            for (int h = 0; h < GW_HALVES; h++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++)
                    while (!__all_sync(0xffffffffu,
                                       gw_combine(st_row + 64 * h + 8 * hh,
                                                  p.eps, mean[h][hh],
                                                  rstd[h][hh])))
                        __nanosleep(32);
#endif
            // The warp has its words: it counts itself on their counter now
            // (the old value is needed only at the end, so the round trip
            // passes under the normalisation).
            unsigned *const ctr = p.ws + tm * GW_SLICES + wg_row0 / 16 + wl;
            unsigned old_ctr[GW_HALVES];
            __syncwarp();
#pragma unroll
            for (int h = 0; h < GW_HALVES; h++)
                old_ctr[h] = lane == 0 ? gw_arrive_relaxed(ctr + 4 * h) : 0u;
            if (tid == 128)
                GW_T(13);
            // (3) The units are free: their residual was read above by the
            // warp that now writes, and (WRITE_PRE) the pre stores have
            // read them; else the previous tile's stores have.
#if WRITE_PRE || (!RESIDUAL && !CSLOT)
            gw_units_read<0>(cw, ctid);
#endif
            // gamma and beta of a unit's columns (this thread's pairs of its
            // eight blocks) into registers before its passes: a load between
            // two stmatrix would wait behind the first.
            float2 gv[8], bv[8];
#pragma unroll
            for (int h = 0; h < GW_HALVES; h++)
#pragma unroll
                for (int u = 0; u < UH; u++, cu++) {
                    const unsigned s_u = GW_UNIT(cu);
#pragma unroll
                    for (int jj = 0; jj < 8; jj++) {
                        gv[jj] = gb[4 * (8 * u + jj) + tq];
                        bv[jj] = NORM == 1 ? gb[BLOCK_N / 2 + 4 * (8 * u + jj) + tq]
                                           : make_float2(0.0f, 0.0f);
                    }
#pragma unroll
                    for (int jb = 0; jb < GW_RC; jb += GW_AB) {
                        const int j = 8 * u + jb;
                        unsigned pk[4];
#pragma unroll
                        for (int f = 0; f < 4; f++) {
                            // fragment f = 2 jj + hh: block j + jj, row
                            // g + 8 hh
                            const int jj = f >> 1, hh = f & 1;
                            const float *x = &acc[h][4 * (j + jj) + 2 * hh];
                            const float r = rstd[h][hh],
                                        sh = -mean[h][hh] * r;
                            const float2 g2 = gv[jb + jj], b2 = bv[jb + jj];
#if NORM == 1
                            const float y0 = fmaf(fmaf(x[0], r, sh), g2.x, b2.x);
                            const float y1 = fmaf(fmaf(x[1], r, sh), g2.y, b2.y);
#else
                            (void)b2;
                            const float y0 = x[0] * r * g2.x;
                            const float y1 = x[1] * r * g2.y;
#endif
                            pk[f] = stof_pack2(y0, y1);
                        }
                        st_matrix4(gw_frag_addr(s_u, lr, j, lane), pk[0],
                                   pk[1], pk[2], pk[3]);
                    }
                    gw_store_unit(&p.tm_c, tn * GW_ON + u * 64,
                                  tm * GW_BM + wg_row0 + 64 * h, s_u, cw,
                                  ctid);
                }
            // The last of the GW_NC readers of a warp's rows clears their
            // words and counter, after its stores are on their way. Relaxed:
            // every reader's loads of the words returned their values (used
            // above) before its arrival was issued; each word is written
            // once a launch (a row's tiles run in one round); and every
            // launch touching ws waits for the one before it (stream order,
            // or stof_grid_wait with PDL).
            unsigned last = 0;
            if (lane == 0) {
#pragma unroll
                for (int h = 0; h < GW_HALVES; h++)
                    if (old_ctr[h] == GW_NC - 1u)
                        last |= 1u << h;
            }
            last = __shfl_sync(0xffffffffu, last, 0);
#pragma unroll
            for (int h = 0; h < GW_HALVES; h++)
                if (last >> h & 1u) {
                    // row 16 wl + i % 16 of the half, tile i / 16
                    float2 *const st0 = st_row - g + 64 * h;
                    for (int i = lane; i < GW_NC * 16; i += 32)
                        *(volatile unsigned long long *)(st0 + (i >> 4) * 128 +
                                                         (i & 15)) = 0ull;
                    if (lane == 0)
                        *(volatile unsigned *)(ctr + 4 * h) = 0u;
                }
        }
#else
#if ROPE
        // ---- rotary position embeddings on the accumulators (gemm.h's
        // rope), the bias first (added here, not in the passes below): a
        // head's pair (i, i + ROPE / 2) is columns 8 j + 2 tq + c and
        // 8 (j + ROPE / 16) + 2 tq + c, both this thread's, so nothing is
        // exchanged. Rows g and g + 8 read their positions' (cos, sin)
        // pairs i, i + 1 as one float4 each (the table is L2-resident).
        {
            constexpr int HB = ROPE_HD / 8, RB = ROPE / 16;
#pragma unroll
            for (int h = 0; h < GW_HALVES; h++) {
                if (h >= nh)
                    break;
#if BIAS
#pragma unroll
                for (int j = 0; j < BLOCK_N / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[h][4 * j + e] += (e & 1) ? gm_hi(bias_r[j])
                                                     : gm_lo(bias_r[j]);
#endif
                const int r0 = tm * GW_BM + GW_HROW(h) + wl * 16 + g;
                const float4 *t0 =
                    p.rope_tab + (stof_i64)(r0 % p.rope_seq) * (ROPE / 4) + tq;
                const float4 *t1 = p.rope_tab +
                                   (stof_i64)((r0 + 8) % p.rope_seq) *
                                       (ROPE / 4) + tq;
#pragma unroll
                for (int hd = 0; hd < BLOCK_N / ROPE_HD; hd++) {
                    // (heads ascend: past rope_cols, V's heads follow)
                    if (tn * BLOCK_N + hd * ROPE_HD >= p.rope_cols)
                        break;
                    // (groups of GR blocks: the loads of a group in
                    // flight together, 8 GR registers beside acc)
                    constexpr int GR = RB < 4 ? RB : 4;
#pragma unroll
                    for (int j0 = 0; j0 < RB; j0 += GR) {
                    float4 cs[2 * GR];
#pragma unroll
                    for (int jj = 0; jj < GR && j0 + jj < RB; jj++) {
                        cs[2 * jj] = t0[4 * (j0 + jj)];
                        cs[2 * jj + 1] = t1[4 * (j0 + jj)];
                    }
#pragma unroll
                    for (int jj = 0; jj < GR && j0 + jj < RB; jj++) {
                        const int ja = hd * HB + j0 + jj, jz = ja + RB;
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            // e = 2 hh + c: row g + 8 hh, pair i + c
                            const float4 q = cs[2 * jj + (e >> 1)];
                            const float co = (e & 1) ? q.z : q.x;
                            const float si = (e & 1) ? q.w : q.y;
                            const float x = acc[h][4 * ja + e];
                            const float y = acc[h][4 * jz + e];
                            acc[h][4 * ja + e] = x * co - y * si;
                            acc[h][4 * jz + e] = y * co + x * si;
                        }
                    }
                    }
                }
            }
        }
#endif
        // ---- epilogue: registers -> shared memory -> TMA stores, in C
        // units of 64 rows x 64 columns (128-byte rows, the TMA's 128-byte
        // swizzle: conflict-free for the fragment pattern) through a ring
        // of GW_CBUF units a warpgroup: a unit is written once the store
        // GW_CBUF units back has read its buffer, and its own store (one
        // thread) runs on while the warpgroup writes the next units and
        // starts its next tile. Staging whole tiles took 64 KB at 128 x 256
        // (one pipeline stage less); the ring takes 16 KB a warpgroup.
        // RESIDUAL: the ring holds a whole tile's units, into which the
        // residual was loaded by TMA during the K loop; each thread reads
        // its pairs there and writes its results in their place (measured,
        // H100: loading each thread's pairs from global memory in the
        // epilogue made a 16384 x 2304 x 768 GEMM 1.75x slower than plain,
        // 1.24x cuBLASLt's time with the same epilogue).
#if !CSLOT
        const unsigned s_c = base + GW_OFF_C + cw * (GW_CBUF * 64 * 128);
#endif
#pragma unroll
        for (int h = 0; h < GW_HALVES; h++) {
            if (h >= nh) // a split tail's half: one 64-row half
                break;
#pragma unroll
            for (int j0 = 0; j0 < GW_ON / 8; j0 += GW_RC, cu++) {
                const unsigned s_u = GW_UNIT(cu);
#if CSLOT
                // (the units were handed over above, the residual in them)
#elif RESIDUAL
                // The residual is in the unit already (loaded by TMA).
                if (h == 0 && j0 == 0) {
                    mb_wait(GW_RES(cw), res_ph);
                    res_ph ^= 1u;
                }
#else
                gw_units_read<GW_CBUF - 1>(cw, ctid);
#endif
                // GW_AB 8-column blocks at a time through the activation:
                // 4 GW_AB independent chains (gm_act_n).
#pragma unroll
                for (int jb = 0; jb < GW_RC; jb += GW_AB) {
                    // [4 jj + 2 hh + c]: row g + 8 hh of the warp's 16,
                    // column 2 tq + c of block j0 + jb + jj (the
                    // accumulators' own order)
                    float v[4 * GW_AB];
#if GATED
                    float u[4 * GW_AB];
#endif
#pragma unroll
                    for (int jj = 0; jj < GW_AB; jj++) {
                        const int j = j0 + jb + jj;
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            v[4 * jj + e] = acc[h][4 * j + e];
#if GATED
                            u[4 * jj + e] = acc[h][4 * (j + GW_HB) + e];
#endif
#if BIAS && !ROPE
                            v[4 * jj + e] += (e & 1) ? gm_hi(bias_r[j])
                                                     : gm_lo(bias_r[j]);
#if GATED
                            u[4 * jj + e] +=
                                (e & 1) ? gm_hi(bias_r[j + GW_HB])
                                        : gm_lo(bias_r[j + GW_HB]);
#endif
#endif
                        }
                    }
                    gm_act_n(v);
                    // The four 8 x 8 fragments [2 jj + hh] (rows 8 hh ..
                    // 8 hh + 7 of the warp's 16, block j0 + jb + jj),
                    // packed, go through one ldmatrix (the residual) and
                    // one stmatrix: lane l addresses row l % 8 of
                    // fragment l / 8 (the swizzled 16-byte chunk of its
                    // block).
                    static_assert(GW_AB == 2, "one stmatrix.x4 a pass");
#if GATED
#pragma unroll
                    for (int i = 0; i < 4 * GW_AB; i++)
                        v[i] *= u[i];
#endif
                    const int lr = wl * 16 + 8 * ((lane >> 3) & 1) +
                                   (lane & 7);
                    const unsigned m_addr =
                        gw_frag_addr(s_u, lr, j0 + jb, lane);
#if RESIDUAL
                    gw_add_frags(v, m_addr);
#endif
                    unsigned pk[4];
#pragma unroll
                    for (int f = 0; f < 4; f++)
                        pk[f] = stof_pack2(v[2 * f], v[2 * f + 1]);
                    st_matrix4(m_addr, pk[0], pk[1], pk[2], pk[3]);
                }
                gw_store_unit(&p.tm_c, tn * GW_ON + j0 * 8,
                              tm * GW_BM + GW_HROW(h), s_u, cw, ctid);
            }
        }
#endif // NORM
#if CSLOT
        // The C slots go back to the producer once this warpgroup's
        // stores have read them: each consumer warp arrives on every slot
        // of the tile, as for a K-step (safe: it has waited for each
        // slot's data, so the other warpgroup released the K-step before).
        gw_units_read<0>(cw, ctid);
        __syncwarp();
        if (lane == 0)
            for (int j = 0; j < GW_NCS; j++)
                gw_release(GW_EMPTY((cs0 + j) % STAGES));
#endif
#undef GW_UNIT
    }
    // Leave only once the last stores have read this CTA's shared memory;
    // their writes to C complete with the grid (as for any store), so a
    // CTA's last tile does not wait for them (measured, H100, GW_TRACE:
    // 450-1750 cycles at a one-round GEMM's end).
#undef GW_HROW
    if (tid == 128)
        GW_T(8);
    if (ctid == 0)
        bulk_wait_read<0>();
    if (tid == 128) {
        GW_T(9);
        GW_TG(10);
    }
    } // consumers
#if CLUSTER > 1
    // Nor before the peer's last arrivals on this CTA's barriers.
    cluster_sync();
#endif
#undef GW_FULL
#undef GW_EMPTY
#undef GW_ORDER
#undef GW_RES
#undef GW_SA
#undef GW_SW
#else
    __trap(); // needs sm_90a (wgmma, setmaxnreg)
#endif
}
