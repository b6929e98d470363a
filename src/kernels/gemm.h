/*
 * gemm.h - GEMMs of the layer chain: C = epilogue(A W^T), with A [M][K]
 * and W [N][K] row-major (W is an nn.Linear weight), on tensor cores
 * (jit_templates/gemm.cu, mma.sync, sm_80+; jit_templates/gemm_wgmma.cu,
 * TMA + wgmma, persistent, sm_90a) or through cuBLASLt (blaslt.h). The
 * epilogue is fixed at compile time.
 */
#ifndef STOF_GEMM_H
#define STOF_GEMM_H

#include "internal.h"

/* The Hopper template: 128-row tiles, 64 of K per stage; with a row norm
 * a row is at most WG_NORM_TILES tiles. */
#define WG_BM 128
#define WG_BK 64
#define WG_NORM_TILES 16
/* The norm's row counters a tile row in its workspace: one a warp's 16
 * rows (GW_SLICES in gemm_wgmma.cu). */
#define WG_ROW_SLICES 8

/* A launch of `items` ping-pong tiles (no pairs, no norm) on `grid` CTAs:
 * when its last round would leave at least half of the CTAs idle (items =
 * R grid + r, R >= 1, 0 < r <= grid / 2), the last r tiles run as 2 r
 * items of 64 rows (gemm_wgmma.cu, GW_SPLIT). Returns the first of those
 * items, or items when none is split; the launch then has items +
 * (items - split) items. */
static inline int64_t stof__gemm_split_from(int64_t items, int64_t grid)
{
    if (grid <= 0 || items <= grid)
        return items;
    const int64_t r = items % grid;
    return r > 0 && 2 * r <= grid ? items - r : items;
}
/* Whether launches split tails (default on; STOF_GEMM_SPLIT=0 turns it
 * off, read once), and a switch for comparisons in tests and benches. */
int stof__gemm_split_enabled(void);
void stof__gemm_split_set(int on);

/* What follows the product, in this order, on v = acc (fp32):
 *   bias:     v += bias[n]
 *   act:      v = act(v)                    (stof_activation)
 *   gated:    a gated FFN (SwiGLU, GeGLU): W has 2N rows (the gate's N,
 *             then the up projection's N; bias 2N values in that order)
 *             and v = act(g + bias[n]) * (u + bias[N + n]), g and u the
 *             products with rows n and N + n. Only the Hopper template
 *             fuses it (elsewhere a layer runs the 2N-wide GEMM and
 *             layer_ops.cu's gate kernel); not with norm.
 *   residual: v += residual[m][n]
 *   norm:     out = norm(v over the whole row n = 0..N-1), with gamma/beta
 *             (1 = STOF_NORM_LAYER + 1, 2 = STOF_NORM_RMS + 1); in the
 *             mma.sync template's row-complete variant (a CTA owns block_m
 *             whole rows) or the Hopper template (a row's ceil(N /
 *             block_n) <= 16 tiles run in the same round of a resident
 *             grid and exchange row statistics through the workspace),
 *             only with act = STOF_ACT_NONE. v is rounded to the dtype
 *             before the norm (as an unfused chain would store it).
 *   write_pre: with norm, also store the rounded v to pre[m][n].
 *   rope:     rotary position embeddings after the bias (rope > 0: the
 *             rotated channels of each head of rope_hd columns, a
 *             multiple of 16 <= rope_hd): in the heads whose columns lie
 *             below args.rope_cols, row m (position p = m % args.rope_seq)
 *             rotates each pair (i, i + rope / 2), i < rope / 2, of its
 *             head by the table's angle: (x, y) -> (x c - y s, y c + x s),
 *             (c, s) = args.rope_tab[p][i] (stof__rope_table). Only the
 *             Hopper template fuses it (block_n a multiple of rope_hd;
 *             not with act, gated, residual or norm); elsewhere a layer
 *             runs the plain GEMM and the rope kernel (stof__rope_launch)
 *             on its output in place.
 * The output (and residual, pre) use leading dimension ldc. */
typedef struct stof_gemm_epi {
    int bias;
    int act;
    int residual;
    int norm;
    int write_pre;
    int gated;
    int rope, rope_hd;
} stof_gemm_epi;

/* Template configuration: CTA tile block_m x block_n x block_k, a
 * warps_m x warps_n grid of warps, `stages` cp.async stages. In the
 * row-complete (norm) variant block_n is the width of one pass and the
 * CTA loops over all of N.
 * wgmma = 1: the Hopper template (gemm_wgmma.cu, compute capability 9.0
 * only): block_m 128, block_k 64, block_n 64, 128 or 256, 2..6 TMA
 * stages; warps_n 1 and warps_m 2 (two consumer warpgroups share each
 * tile) or 1 (ping-pong: they take whole tiles in turn, block_n <= 128);
 * one CTA per SM walks the tiles (stof__gemm_launch's ctas). With a norm:
 * cluster 1, the kernel compiled for its N (like the row-complete
 * variant), a cooperative launch (all CTAs resident) of a multiple of the
 * row's tiles, and a workspace.
 * cluster (wgmma only): 0 or 1 alone; 2: clusters of two CTAs on tile
 * rows 2i, 2i + 1 of one column, each W tile read once for both (TMA
 * multicast).
 * cslot (wgmma only, with a residual or a norm, warps_m 2, alone): 1
 * puts a tile's C units (which hold its residual, or its rows until
 * their statistics are in) in the pipeline's slots after its K-steps
 * instead of a ring of their own, so the tile keeps one more stage
 * (128 x 256: four instead of three; 128 x 192 five, 128 x 128 six). */
typedef struct stof_gemm_cfg {
    int block_m, block_n, block_k;
    int warps_m, warps_n;
    int stages;
    int wgmma;
    int cluster;
    int cslot;
} stof_gemm_cfg;

/* Launch arguments. Pointers the epilogue does not use may be 0. N is the
 * output's width (with gated, W has 2N rows). */
typedef struct stof_gemm_args {
    CUdeviceptr a, w, c;
    CUdeviceptr bias, residual, gamma, beta, pre;
    int M, N, K;
    int64_t lda, ldw, ldc; /* elements */
    float eps;
    /* The Hopper template with a norm: its workspace of
     * stof__gemm_ws_bytes, zeroed once when allocated (each launch
     * leaves it ready for the next); launches using it run in order. */
    CUdeviceptr ws;
    /* rope: the (cos, sin) table [rope_seq][rope / 2] (float pairs), the
     * sequence length (positions are m % rope_seq) and the rotated
     * columns [0, rope_cols) (Q and K), a multiple of rope_hd. */
    CUdeviceptr rope_tab;
    int rope_seq, rope_cols;
} stof_gemm_args;

/* Shape rules of the templates: N and K multiples of 8, lda/ldw/ldc
 * multiples of 8, pointers 16-byte aligned; M, N, K tails are handled. */

/* 1 when (cfg, epi) is a legal kernel for an N x K problem on dev (dev
 * may be NULL: no shared-memory check); else 0 and the reason. */
int stof__gemm_cfg_valid(const stof_device *dev, const stof_gemm_cfg *c,
                         const stof_gemm_epi *e, int N, int K, char *why,
                         size_t n);

/* The workspace (stof_gemm_args.ws) a launch of (c, e) for M x N needs in
 * bytes: 0 but for the Hopper template with a norm. */
size_t stof__gemm_ws_bytes(const stof_gemm_cfg *c, const stof_gemm_epi *e,
                           int M, int N);

/* The largest workspace (stof__gemm_ws_bytes) a Hopper norm candidate of
 * stof__gemm_candidates for M x N needs on dev (its narrowest tile's): 0
 * off Hopper, and when no norm tile can take a row of N. */
size_t stof__gemm_norm_ws_max(const stof_device *dev, int M, int N);

/* Dynamic shared memory of one CTA in bytes. */
size_t stof__gemm_smem_bytes(const stof_gemm_cfg *c, const stof_gemm_epi *e,
                             int N);

/* The templates' candidate configurations for an M x N x K problem with
 * epilogue e on dev (the Hopper template's only when dev is given and has
 * compute capability 9.0): fills up to max entries, returns how many. */
int stof__gemm_candidates(const stof_device *dev, const stof_gemm_epi *e,
                          int M, int N, int K, stof_gemm_cfg *out, int max);

/* Predicted time in ms of (c, e) on dev for M x N x K (the cost model). */
double stof__gemm_model_ms(const stof_device *dev, const stof_gemm_cfg *c,
                           const stof_gemm_epi *e, int M, int N, int K);

/* NVRTC compile of gemm.cu for (dt, c, e, N) (N is compiled in only with
 * a norm) for `arch` (NULL = ctx's device), or of
 * gemm_wgmma.cu for sm_90a when c->wgmma. No GPU work: thread-safe with
 * ctx NULL. *cubin malloc'd. */
stof_status stof__gemm_compile(stof_context *ctx, stof_dtype dt,
                               const stof_gemm_cfg *c, const stof_gemm_epi *e,
                               int N, const char *arch, void **cubin /* OUT */,
                               size_t *size /* OUT */);

/* Load a cubin from stof__gemm_compile, setting its shared memory limit. */
stof_status stof__gemm_load_cubin(stof_context *ctx, const stof_gemm_cfg *c,
                                  const stof_gemm_epi *e, int N,
                                  const void *cubin, CUmodule *mod /* OUT */,
                                  CUfunction *fn /* OUT */);
/* The same through the context's module cache (stof__module_load_shared_
 * hashed: hash 0 or the cubin's XXH3-64, cubin NULL for a module the cache
 * may hold; give the module back with stof__module_release). */
stof_status stof__gemm_load_cubin_shared(stof_context *ctx,
                                         const stof_gemm_cfg *c,
                                         const stof_gemm_epi *e, int N,
                                         const void *cubin, size_t size,
                                         uint64_t hash,
                                         CUmodule *mod /* OUT */,
                                         CUfunction *fn /* OUT */);

/* Enqueue. Capture-safe (no allocation, copy or synchronisation; the
 * Hopper template's tensor maps are encoded on the host, by value).
 * ctas: the Hopper template's grid, at most one CTA per SM (0: one per
 * tile); ignored by the mma.sync template. STOF_ERR_UNSUPPORTED when the
 * driver lacks cuTensorMapEncodeTiled. */
stof_status stof__gemm_launch(CUfunction fn, const stof_gemm_cfg *c,
                              const stof_gemm_epi *e, const stof_gemm_args *a,
                              int ctas, CUstream stream, const stof_api *api);

/* The unfused activation or gate (layer_ops.cu's stof_gate): out[r][c] =
 * act(x[r][c]) (* x[r][n + c] when gated) over rows x n. Compile (NVRTC,
 * for ctx's device; thread-safe with ctx NULL and arch given) and
 * enqueue: n, ld_x and ld_out multiples of 8 (elements), pointers 16-byte
 * aligned; out may alias x when not gated (gated: overlapping ranges are
 * refused). Capture-safe. */
stof_status stof__gate_compile(stof_context *ctx, stof_dtype dt, int act,
                               int gated, const char *arch,
                               void **cubin /* OUT */, size_t *size /* OUT */);
stof_status stof__gate_launch(CUfunction fn, CUdeviceptr x, CUdeviceptr out,
                              int rows, int n, int64_t ld_x, int64_t ld_out,
                              int gated, CUstream stream, const stof_api *api);

/* JSON object of (c, e) for descriptions and tuning records, and its
 * parse (0 on a malformed string). */
void stof__gemm_cfg_json(const stof_gemm_cfg *c, const stof_gemm_epi *e,
                         stof_str *out);
int stof__gemm_cfg_parse(const char *json, stof_gemm_cfg *c,
                         stof_gemm_epi *e);

/* CPU reference of the same semantics in float (inputs already converted
 * from the dtype; `round` != 0 rounds v to `dt` before the norm and on
 * output, like the kernels). out [M][ldc]; pre may be NULL. */
void stof__ref_gemm(const float *A, const float *W, const float *bias,
                    const float *residual, const float *gamma,
                    const float *beta, int M, int N, int K, int64_t lda,
                    int64_t ldw, int64_t ldc, const stof_gemm_epi *e,
                    float eps, stof_dtype dt, float *out, float *pre);

/* stof__ref_gemm with the epilogue's rope (e->rope): tab as the kernels
 * read it (stof__rope_table), pos[m] the table row of output row m (pos
 * NULL: row m), the columns [0, cols) rotated. rope NULL, its tab NULL or
 * e->rope 0: stof__ref_gemm. With qk_gamma ([2][e->rope_hd]: Q's weight
 * for the heads below q_cols, then K's), each head below cols is first
 * normalised (RMSNorm, eps qk_eps; the QK norm of stof_qk_norm), then
 * rotated when tab and e->rope say so. */
typedef struct stof_ref_rope {
    const float *tab;
    const int *pos;
    int cols;
    const float *qk_gamma;
    int q_cols;
    float qk_eps;
} stof_ref_rope;
void stof__ref_gemm_rope(const float *A, const float *W, const float *bias,
                         const float *residual, const float *gamma,
                         const float *beta, int M, int N, int K, int64_t lda,
                         int64_t ldw, int64_t ldc, const stof_gemm_epi *e,
                         float eps, stof_dtype dt, const stof_ref_rope *rope,
                         float *out, float *pre);

/* The RoPE table of n positions (pos[k], or k when pos is NULL) and
 * `rope` rotated channels (even) with base theta: tab[k][i] = (cos, sin)
 * of the fp32 angle a = p * f_i, f_i = 1 / theta^(2 i / rope) in fp32
 * (Hugging Face's inv_freq), to within about 1e-11 of cos(a) and sin(a)
 * before their rounding to float (without pos: a rotation recurrence in
 * double, corrected by a's rounding, re-anchored every 64 positions; with
 * pos: libm). tab holds n * rope floats. */
void stof__rope_table(float *tab, const int *pos, int n, int rope,
                      float theta); /* (rope above 256: nothing written) */

/* Hugging Face's default frequencies: f[i] = 1 / theta^(2 i / rope) in
 * fp32, i < rope / 2. */
void stof__rope_freqs(float *f, int rope, float theta);

/* stof__rope_table of given frequencies freq[rope / 2] (f_i, any finite
 * values >= 0), cos and sin each multiplied by scale in fp32 after their
 * rounding (Hugging Face's attention_scaling; 1: none). */
void stof__rope_table_f(float *tab, const int *pos, int n, int rope,
                        const float *freq, float scale);

/* Forget the gate and rope kernels' cubins kept for the process (tests:
 * a fresh process's view). */
void stof__aux_memo_clear(void);

/* The unfused RoPE (layer_ops.cu's stof_rope): in place on x [rows][ld],
 * the heads of hd columns below cols rotated as the epilogue's rope
 * does (after rounding: x holds the GEMM's rounded output), tab on the
 * device. Compile (NVRTC for ctx's device, or arch; thread-safe with ctx
 * NULL) and enqueue (capture-safe): hd a multiple of 8, rope of 4 (rope <=
 * hd), cols a multiple of hd <= ld, ld a multiple of 8, x 16-byte
 * aligned. */
stof_status stof__rope_compile(stof_context *ctx, stof_dtype dt, int hd,
                               int rope, const char *arch,
                               void **cubin /* OUT */, size_t *size /* OUT */);
stof_status stof__rope_launch(CUfunction fn, CUdeviceptr x, int rows,
                              int64_t ld, int cols, int hd, int rope,
                              CUdeviceptr tab, int seq, CUstream stream,
                              const stof_api *api);

/* The QK norm and RoPE (layer_ops.cu's stof_qk_norm, in the module
 * stof__rope_compile makes): in place on x [rows][ld], the heads of hd
 * columns below cols normalised by RMSNorm (eps; gamma [2][hd] on the
 * device: Q's weight for the heads below q_cols, then K's), then rotated
 * over their first rope channels (0: none) as the rope kernel does, in
 * fp32, rounded once. hd a multiple of 8 up to 256, rope even up to hd,
 * q_cols and cols multiples of hd, ld even >= cols; x and gamma 4-byte
 * aligned, tab (with rope) 8-byte aligned. */
stof_status stof__qknorm_launch(CUfunction fn, CUdeviceptr x, int rows,
                                int64_t ld, int q_cols, int cols, int hd,
                                int rope, CUdeviceptr tab, int seq,
                                CUdeviceptr gamma, float eps,
                                CUstream stream, const stof_api *api);

/* The activations and a row norm, in float, shared by the references. */
float stof__ref_act(float v, int act);
void stof__ref_norm_row(const float *v, const float *gamma, const float *beta,
                        int n, int kind /* stof_norm_kind */, float eps,
                        float *out);

#endif /* STOF_GEMM_H */
