// layer_ops.cu - the memory-bound kernels of the layer chain: bias +
// residual + LayerNorm/RMSNorm over rows of HIDDEN elements (stof_norm),
// a GEMM's unfused activation or gate (stof_gate, below) and its unfused
// rotary position embeddings (stof_rope).
//
// One warp per row at a time, WARPS warps per CTA, rows warp-strided over
// the grid (any grid.x: the host launches at most one wave). A
// row is HIDDEN/8 chunks of 8 elements (16 bytes); lane l owns chunks
// l, l+32, l+64, ... and keeps them in registers, so the row is read once:
//   v    = x[r] (+ bias) (+ residual[r])   in fp32, then rounded to the
//          dtype, as an unfused chain would have stored the sum
//   pre  = v                                (WRITE_PRE: pre-norm models
//          keep the sum as the residual stream)
//   out  = (v - mean) * rstd * gamma + beta  (NORM 1, LayerNorm; the
//          variance is the mean of (v - mean)^2, computed from the
//          registers in a second pass)
//        = v * rsqrt(mean(v^2) + eps) * gamma (NORM 2, RMSNorm)
// Every pointer is 16-byte aligned and ld (elements between rows) is a
// multiple of 8; x, residual, out and pre share ld. out may alias x or
// residual (each lane reads its chunks before writing them).
//
// Compile-time parameters (-D):
//   DTYPE 0 fp16, 1 bf16     HIDDEN row length, a multiple of 8, <= 16384
//   NORM 1 LayerNorm, 2 RMSNorm       WARPS rows per CTA (1..32)
//   BIAS, RESIDUAL, WRITE_PRE 0/1
//   ACT, GATED: stof_gate's (below)
//
// STOF_VARIANTS: DTYPE=0,HIDDEN=768,NORM=1,WARPS=4,BIAS=1,RESIDUAL=1,WRITE_PRE=0 | DTYPE=1,HIDDEN=1024,NORM=2,WARPS=8,BIAS=0,RESIDUAL=0,WRITE_PRE=1
// STOF_VARIANTS: DTYPE=0,HIDDEN=72,NORM=1,WARPS=2,BIAS=0,RESIDUAL=1,WRITE_PRE=1 | DTYPE=1,HIDDEN=4096,NORM=1,WARPS=4,BIAS=1,RESIDUAL=0,WRITE_PRE=0
// STOF_VARIANTS: DTYPE=1,ACT=4,GATED=1 | DTYPE=0,ACT=2,GATED=0
#include "gemm_epi.cuh"

#ifndef HIDDEN
#define HIDDEN 768
#endif
#ifndef NORM
#define NORM 1
#endif
#ifndef WARPS
#define WARPS 4
#endif
#ifndef BIAS
#define BIAS 0
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
#ifndef WRITE_PRE
#define WRITE_PRE 0
#endif
#ifndef GATED
#define GATED 0
#endif

#if HIDDEN % 8 != 0 || HIDDEN < 8 || HIDDEN > 16384
#error "HIDDEN must be a multiple of 8 in [8, 16384]"
#endif
#if NORM != 1 && NORM != 2
#error "NORM must be 1 (LayerNorm) or 2 (RMSNorm)"
#endif
#if WARPS < 1 || WARPS > 32
#error "WARPS must be 1..32"
#endif

#define CHUNKS (HIDDEN / 8)
#define PER_LANE ((CHUNKS + 31) / 32)

struct __align__(16) stof_v8 {
    unsigned short h[8];
};

__device__ __forceinline__ void stof_unpack8(const stof_v8 &p, float *f)
{
#pragma unroll
    for (int i = 0; i < 8; i++)
        f[i] = stof_load(&p.h[i]);
}

__device__ __forceinline__ stof_v8 stof_pack8(const float *f)
{
    stof_v8 p;
#pragma unroll
    for (int i = 0; i < 8; i++)
        stof_store(&p.h[i], f[i]);
    return p;
}

// A lane's parameter chunks (gamma, beta, bias) stay in registers across
// the rows a warp takes when they are few (HIDDEN <= 1024): re-read from
// L1 for every row they were most of its traffic (measured, H100, ncu,
// 32768 x 768: L1 89.6% busy, DRAM 43%).
// Then each warp also loads its next row's chunks before this row's
// reductions (one row's latency under another's arithmetic).
#define NORM_HOIST (PER_LANE <= 4)

// A lane's chunks of row `base` of p.
__device__ __forceinline__ void norm_load(const unsigned short *p,
                                          stof_i64 base, int lane,
                                          stof_v8 (&d)[PER_LANE])
{
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) {
        const int c = lane + 32 * j;
        if (c < CHUNKS)
            d[j] = *(const stof_v8 *)(p + base + 8 * c);
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
stof_norm(const unsigned short *x,
          const unsigned short *residual,
          const unsigned short *__restrict__ bias,
          const unsigned short *__restrict__ gamma,
          const unsigned short *__restrict__ beta, unsigned short *out,
          unsigned short *pre, int rows, stof_i64 ld, float eps)
{
    stof_grid_wait(); // programmatic dependent launch: see stof_common.cuh
    stof_grid_release();
    const int lane = threadIdx.x & 31;
#if NORM_HOIST
    stof_v8 g_h[PER_LANE];
#if NORM == 1
    stof_v8 bt_h[PER_LANE];
#endif
#if BIAS
    stof_v8 b_h[PER_LANE];
#endif
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) {
        const int c = lane + 32 * j;
        if (c < CHUNKS) {
            g_h[j] = *(const stof_v8 *)(gamma + 8 * c);
#if NORM == 1
            bt_h[j] = *(const stof_v8 *)(beta + 8 * c);
#endif
#if BIAS
            b_h[j] = *(const stof_v8 *)(bias + 8 * c);
#endif
        }
    }
#define NORM_GAMMA(j, c) g_h[j]
#define NORM_BETA(j, c) bt_h[j]
#define NORM_BIAS(j, c) b_h[j]
#else
#define NORM_GAMMA(j, c) (*(const stof_v8 *)(gamma + 8 * (c)))
#define NORM_BETA(j, c) (*(const stof_v8 *)(beta + 8 * (c)))
#define NORM_BIAS(j, c) (*(const stof_v8 *)(bias + 8 * (c)))
#endif
    // Rows warp, warp + WARPS gridDim.x, ... (the host launches at most
    // one wave of CTAs).
    const int stride = gridDim.x * WARPS;
    int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
    stof_v8 xv[PER_LANE];
#if RESIDUAL
    stof_v8 rv[PER_LANE];
#endif
#if NORM_HOIST
    stof_v8 xn[PER_LANE];
#if RESIDUAL
    stof_v8 rn[PER_LANE];
#endif
    if (row < rows) {
        norm_load(x, (stof_i64)row * ld, lane, xn);
#if RESIDUAL
        norm_load(residual, (stof_i64)row * ld, lane, rn);
#endif
    }
#endif
    for (; row < rows; row += stride) {
        const stof_i64 base = (stof_i64)row * ld;
#if NORM_HOIST
#pragma unroll
        for (int j = 0; j < PER_LANE; j++) {
            xv[j] = xn[j];
#if RESIDUAL
            rv[j] = rn[j];
#endif
        }
        if (row + stride < rows) {
            norm_load(x, base + stride * ld, lane, xn);
#if RESIDUAL
            norm_load(residual, base + stride * ld, lane, rn);
#endif
        }
#else
        norm_load(x, base, lane, xv);
#if RESIDUAL
        norm_load(residual, base, lane, rv);
#endif
#endif
        float v[PER_LANE][8];
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < PER_LANE; j++) {
            const int c = lane + 32 * j;
            if (c < CHUNKS) {
                stof_unpack8(xv[j], v[j]);
#if BIAS
                float b[8];
                stof_unpack8(NORM_BIAS(j, c), b);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    v[j][i] += b[i];
#endif
#if RESIDUAL
                float r[8];
                stof_unpack8(rv[j], r);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    v[j][i] += r[i];
#endif
                // Round the sum to the dtype: the norm sees what an
                // unfused chain would have stored.
                const stof_v8 p = stof_pack8(v[j]);
#if WRITE_PRE
                *(stof_v8 *)(pre + base + 8 * c) = p;
#endif
                stof_unpack8(p, v[j]);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    sum += NORM == 1 ? v[j][i] : v[j][i] * v[j][i];
            }
        }
        sum = stof_warp_sum(sum);
#if NORM == 1
        const float mean = sum * (1.0f / HIDDEN);
        float sq = 0.0f;
#pragma unroll
        for (int j = 0; j < PER_LANE; j++)
            if (lane + 32 * j < CHUNKS) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float d = v[j][i] - mean;
                    sq += d * d;
                }
            }
        sq = stof_warp_sum(sq);
        const float rstd = rsqrtf(sq * (1.0f / HIDDEN) + eps);
#else
        const float mean = 0.0f;
        const float rstd = rsqrtf(sum * (1.0f / HIDDEN) + eps);
#endif
#pragma unroll
        for (int j = 0; j < PER_LANE; j++) {
            const int c = lane + 32 * j;
            if (c < CHUNKS) {
                float g[8], o[8];
                stof_unpack8(NORM_GAMMA(j, c), g);
#if NORM == 1
                float bt[8];
                stof_unpack8(NORM_BETA(j, c), bt);
#endif
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    o[i] = (v[j][i] - mean) * rstd * g[i];
#if NORM == 1
                    o[i] += bt[i];
#endif
                }
                *(stof_v8 *)(out + base + 8 * c) = stof_pack8(o);
            }
        }
    }
#undef NORM_GAMMA
#undef NORM_BETA
#undef NORM_BIAS
    (void)beta;
    (void)bias;
    (void)residual;
    (void)pre;
}

// The activation or the gate of a GEMM whose kernel cannot fuse it (the
// mma.sync template and cuBLASLt have no gated epilogue, cuBLASLt no erf):
//   GATED 1: out[r][c] = act(x[r][c]) * x[r][n + c]   (x has 2n columns)
//   GATED 0: out[r][c] = act(x[r][c])                 (out may alias x)
// in fp32, rounded once; ACT as in gemm_epi.cuh (0 none, 1 gelu (tanh),
// 2 gelu (erf), 3 relu, 4 silu). n and the leading dimensions (elements)
// are multiples of 8, the pointers 16-byte aligned: 8 elements a thread
// per step of a grid-stride loop.
extern "C" __global__ void stof_gate(const unsigned short *x,
                                     unsigned short *out, int rows, int n,
                                     stof_i64 ld_x, stof_i64 ld_out)
{
    stof_grid_wait(); // programmatic dependent launch: see stof_common.cuh
    stof_grid_release();
    const int per_row = n / 8;
    const stof_i64 total = (stof_i64)rows * per_row;
    for (stof_i64 i = blockIdx.x * (stof_i64)blockDim.x + threadIdx.x;
         i < total; i += (stof_i64)gridDim.x * blockDim.x) {
        const stof_i64 r = i / per_row;
        const int c = (int)(i - r * per_row) * 8;
        float g[8];
        stof_unpack8(*(const stof_v8 *)(x + r * ld_x + c), g);
#if GATED
        float u[8];
        stof_unpack8(*(const stof_v8 *)(x + r * ld_x + n + c), u);
#endif
        gm_act_n(g);
#if GATED
#pragma unroll
        for (int k = 0; k < 8; k++)
            g[k] *= u[k];
#endif
        *(stof_v8 *)(out + r * ld_out + c) = stof_pack8(g);
    }
}

// Rotary position embeddings of a GEMM whose kernel cannot fuse them (the
// mma.sync template, cuBLASLt), in place on its rounded output x [rows]
// [ld]: in each head of hd columns below cols, row r (position p = r %
// seq) rotates the pairs (i, i + rope / 2), i < rope / 2, by tab[p][i] =
// (cos, sin): (a, b) -> (a cos - b sin, b cos + a sin), in fp32, rounded
// once (gemm.h's rope). hd a multiple of 8, rope of 4, cols of hd, ld
// of 8, x 16-byte aligned: a thread step rotates 8 pairs (two 16-byte
// chunks of a row and 64 bytes of the table) where rope is a multiple of
// 16, else 2 pairs (two 4-byte chunks, 16 bytes of the table: GPT-NeoX
// 20B's 24 channels, StableLM 3B's 20), grid-stride.
extern "C" __global__ void stof_rope(unsigned short *x, int rows, stof_i64 ld,
                                     int cols, int hd, int rope,
                                     const float4 *tab, int seq)
{
    stof_grid_wait(); // programmatic dependent launch: see stof_common.cuh
    stof_grid_release();
    const int half = rope / 2, gw = half % 8 == 0 ? 8 : 2,
              groups = half / gw;
    const stof_i64 per_row = (stof_i64)(cols / hd) * groups;
    const stof_i64 total = (stof_i64)rows * per_row;
    for (stof_i64 i = blockIdx.x * (stof_i64)blockDim.x + threadIdx.x;
         i < total; i += (stof_i64)gridDim.x * blockDim.x) {
        const stof_i64 r = i / per_row;
        const int k = (int)(i - r * per_row), h = k / groups;
        const int c = (k - h * groups) * gw;
        const int pos = (int)(r % seq);
        unsigned short *pa = x + r * ld + (stof_i64)h * hd + c;
        if (gw == 2) { /* (c and half even: 4-byte pairs, a float4) */
            unsigned *const pu = (unsigned *)pa, *const pv = (unsigned *)(pa + half);
            const unsigned ua = *pu, ub = *pv;
            const float4 cs = tab[((stof_i64)pos * half + c) / 2];
            const float a0 = gm_lo(ua), a1 = gm_hi(ua);
            const float b0 = gm_lo(ub), b1 = gm_hi(ub);
            *pu = stof_pack2(a0 * cs.x - b0 * cs.y, a1 * cs.z - b1 * cs.w);
            *pv = stof_pack2(b0 * cs.x + a0 * cs.y, b1 * cs.z + a1 * cs.w);
            continue;
        }
        float a[8], b[8];
        stof_unpack8(*(const stof_v8 *)pa, a);
        stof_unpack8(*(const stof_v8 *)(pa + half), b);
        const float4 *t = tab + ((stof_i64)pos * half + c) / 2;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float4 cs = t[q];
            const float a0 = a[2 * q], b0 = b[2 * q];
            const float a1 = a[2 * q + 1], b1 = b[2 * q + 1];
            a[2 * q] = a0 * cs.x - b0 * cs.y;
            b[2 * q] = b0 * cs.x + a0 * cs.y;
            a[2 * q + 1] = a1 * cs.z - b1 * cs.w;
            b[2 * q + 1] = b1 * cs.z + a1 * cs.w;
        }
        *(stof_v8 *)pa = stof_pack8(a);
        *(stof_v8 *)(pa + half) = stof_pack8(b);
    }
}

// A QK norm (Qwen3's q_norm and k_norm) and RoPE after a plain QKV
// product, in place on its rounded output x [rows][ld]: each head of hd
// columns below cols (Q's below q_cols, then K's) is normalised by RMSNorm
// over its hd values, v / sqrt(mean(v^2) + eps) * gamma[j] (gamma [2][hd]:
// Q's weight, then K's), in fp32, then rotated as stof_rope rotates
// (rope 0: not at all; tab as there, position r % seq), and rounded once.
// One warp a (row, head), grid-stride; the head is exchanged through
// shared memory (pairs (i, i + rope / 2) lie in different lanes). hd a
// multiple of 8 up to 256, rope even (or 0) up to hd, cols a multiple of
// hd, 4-byte aligned x, gamma and ld even. Blocks of QK_WARPS warps.
#define QK_WARPS 4
extern "C" __global__ void __launch_bounds__(32 * QK_WARPS)
stof_qk_norm(unsigned short *x, int rows, stof_i64 ld, int q_cols,
             int cols, int hd, int rope, const float2 *tab, int seq,
             const unsigned short *gamma, float eps)
{
    stof_grid_wait(); // programmatic dependent launch: see stof_common.cuh
    stof_grid_release();
    __shared__ float sv[QK_WARPS][256];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    float *const v = sv[wi];
    const int heads = cols / hd, half = rope / 2;
    const stof_i64 total = (stof_i64)rows * heads;
    const stof_i64 step = (stof_i64)gridDim.x * QK_WARPS;
    for (stof_i64 it = (stof_i64)blockIdx.x * QK_WARPS + wi; it < total;
         it += step) {
        const stof_i64 r = it / heads;
        const int h = (int)(it - r * heads);
        unsigned short *const p = x + r * ld + (stof_i64)h * hd;
        const unsigned short *const g = gamma + (h * hd < q_cols ? 0 : hd);
        float a[8];
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int e = lane + 32 * k;
            a[k] = e < hd ? stof_load(p + e) : 0.0f;
            ss += a[k] * a[k];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float rs = rsqrtf(ss / (float)hd + eps);
        __syncwarp(); // (the last item's reads of v are done)
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int e = lane + 32 * k;
            if (e < hd) {
                a[k] = a[k] * rs * stof_load(g + e);
                v[e] = a[k];
            }
        }
        __syncwarp();
        const int pos = (int)(r % seq);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int e = lane + 32 * k;
            if (e >= hd)
                continue;
            float y = a[k];
            if (e < rope) {
                const int i = e < half ? e : e - half;
                const float2 cs = tab[(stof_i64)pos * half + i];
                y = e < half ? a[k] * cs.x - v[e + half] * cs.y
                             : a[k] * cs.x + v[e - half] * cs.y;
            }
            p[e] = (unsigned short)(stof_pack2(y, 0.0f) & 0xffffu);
        }
    }
}

// Scratch data for tuning: p[i] = offset + scale * u, u uniform in
// [-1, 1) from a hash of (seed, i). Grid-stride loop.
extern "C" __global__ void stof_fill(unsigned short *p, stof_i64 n,
                                     stof_u64 seed, float scale, float offset)
{
    // A successor launched with PDL may take SMs now (and wait): the
    // GPU suite's pdl_chain test relies on it.
    stof_grid_release();
    for (stof_i64 i = blockIdx.x * (stof_i64)blockDim.x + threadIdx.x; i < n;
         i += (stof_i64)gridDim.x * blockDim.x) {
        stof_u64 z = seed + (stof_u64)i * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float u = (float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
        stof_store(p + i, offset + scale * u);
    }
}
