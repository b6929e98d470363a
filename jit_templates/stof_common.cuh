// stof_common.cuh - helpers shared by every kernel template. Compiled by
// NVRTC only; it includes no CUDA header so that it needs no include path.
#pragma once

#define STOF_NEG_INF __int_as_float(0xff800000u)

typedef unsigned short stof_f16_t;   // raw IEEE half bits
typedef unsigned short stof_bf16_t;  // raw bfloat16 bits
typedef long long stof_i64;
typedef unsigned long long stof_u64;

// The attention kernels' grids put the query row blocks (n_x of them) and
// the batch * heads sequences in x together, row blocks fastest: CTAs
// start in the order of an (x = row block, y = sequence) grid, without
// y's limit of 65535 on batch * heads. This CTA's row block and sequence.
__device__ __forceinline__ void stof_cta_rb_bh(int n_x, int &rb, int &bh)
{
    const unsigned x = blockIdx.x, n = (unsigned)n_x;
    bh = (int)(x / n);
    rb = (int)(x - (unsigned)bh * n);
}

// Programmatic dependent launch (compute capability 9.0+): a kernel the
// host launches with it (stof__launch's pdl) may start while the kernel
// before it in the stream still runs. stof_grid_wait() returns once that
// kernel has completed and its writes are visible: every CTA calls it
// before it reads what that kernel may have written or writes what it may
// still read. stof_grid_release() lets the next such kernel start: its
// CTAs take the SMs this kernel's CTAs leave and wait there, so its launch
// and prologue pass under this kernel's last tiles. Both do nothing in a
// launch without it, and compile to nothing before sm_90.
__device__ __forceinline__ void stof_grid_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void stof_grid_release()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// DTYPE: 0 = fp16, 1 = bf16 (matches stof_dtype in stof.h).
#ifndef DTYPE
#define DTYPE 0
#endif

__device__ __forceinline__ float stof_f16_to_f32(unsigned short h)
{
    float f;
    asm("{ .reg .f16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short stof_f32_to_f16(float f)
{
    unsigned short h;
    asm("{ .reg .f16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float stof_bf16_to_f32(unsigned short h)
{
    return __uint_as_float(((unsigned)h) << 16);
}

__device__ __forceinline__ unsigned short stof_f32_to_bf16(float f)
{
    // Round to nearest even; NaN stays NaN.
    unsigned x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (unsigned short)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (unsigned short)(x >> 16);
}

// The float value of 16-bit bits of the dtype.
__device__ __forceinline__ float stof_load_bits(unsigned short h)
{
#if DTYPE == 0
    return stof_f16_to_f32(h);
#else
    return stof_bf16_to_f32(h);
#endif
}

__device__ __forceinline__ float stof_load(const unsigned short *p)
{
    return stof_load_bits(*p);
}

__device__ __forceinline__ void stof_store(unsigned short *p, float f)
{
#if DTYPE == 0
    *p = stof_f32_to_f16(f);
#else
    *p = stof_f32_to_bf16(f);
#endif
}

__device__ __forceinline__ float stof_warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// The launch parameters every attention kernel receives, by value. The same
// layout is declared in src/attention.c (stof_attn_params); both sides check
// its size.
struct stof_attn_params {
    const unsigned short *q, *k, *v;
    unsigned short *o;
    const stof_u64 *mask_bits;     // seq_q rows of mask_words 64-bit words
    stof_i64 q_stride[3], k_stride[3], v_stride[3], o_stride[3]; // b, h, s
    int batch, heads, seq_q, seq_k;
    int mask_words;
    float scale;
    int kv_group;                  // query heads per K/V head (GQA), >= 1
    float *lse;                    // NULL, or [batch][heads][seq_q]: the
                                   // log-sum-exp of each row's scores
    float softcap;                 // 0, or scores s -> softcap tanh(s / softcap)
    int pad_;
    const float *alibi;            // NULL, or [heads]: + slope (key - row)
    const unsigned short *bias;    // NULL, or the additive bias: element
                                   // (b, h, row, key) at b * bias_stride[0]
                                   // + h * bias_stride[1] + row *
                                   // bias_stride[2] + key; -inf = masked
    stof_i64 bias_stride[3];
};
static_assert(sizeof(stof_attn_params) ==
                  5 * 8 + 12 * 8 + 8 * 4 + 8 + 16 + 4 * 8,
              "stof_attn_params layout");

// ---------------------------------------------------------------------------
// Tensor-core PTX helpers shared by the templates (sm_80+)
// ---------------------------------------------------------------------------

// Generic -> shared-window address of a shared-memory pointer.
__device__ __forceinline__ unsigned stof_smem_addr(const void *p)
{
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
        : "=r"(a)
        : "l"(p));
    return a;
}

// 16-byte global -> shared copy; src_bytes 0 writes 16 zero bytes and
// reads nothing.
__device__ __forceinline__ void stof_cp_async16(unsigned dst, const void *src,
                                                int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void stof_cp_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void stof_cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// C += A * B, m16n8k16 in the dtype, fp32 accumulators.
__device__ __forceinline__ void stof_mma16816(float c[4], const unsigned a[4],
                                              unsigned b0, unsigned b1)
{
#if DTYPE == 0
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two floats -> one register of two 16-bit values, `lo` in bits 0..15 (the
// lower column index, as mma fragments and memory order expect).
__device__ __forceinline__ unsigned stof_pack2(float lo, float hi)
{
    unsigned r;
#if DTYPE == 0
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// ---------------------------------------------------------------------------
// Score modifiers of the fast kernels (compile-time SOFTCAP, ALIBI, BIAS:
// 0/1)
// ---------------------------------------------------------------------------
#ifndef SOFTCAP
#define SOFTCAP 0
#endif
#ifndef ALIBI
#define ALIBI 0
#endif
#ifndef BIAS
#define BIAS 0
#endif
#define STOF_LOG2E 1.4426950408889634f

__device__ __forceinline__ float stof_tanh_approx(float x)
{
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// A raw score x = q.k as the fast kernels' online softmax takes it, in
// log2 units: x * sl2 (sl2 = scale * log2(e)); with SOFTCAP, cap_out *
// tanh(x * cap_in) (cap_in = scale / softcap, cap_out = softcap *
// log2(e)); with ALIBI, plus slope_l2 * dk (the head's slope * log2(e),
// dk = key - query row).
__device__ __forceinline__ float stof_score_l2(float x, float sl2,
                                               float cap_in, float cap_out,
                                               float slope_l2, int dk)
{
#if SOFTCAP
    float v = cap_out * stof_tanh_approx(x * cap_in);
    (void)sl2;
#else
    float v = x * sl2;
    (void)cap_in;
    (void)cap_out;
#endif
#if ALIBI
    v = fmaf(slope_l2, (float)dk, v);
#else
    (void)slope_l2;
    (void)dk;
#endif
    return v;
}

// BIAS: the additive bias of columns c and c + 1 of one query row (row:
// the row's first element, 16-byte aligned rows; c even) as two 16-bit
// values, column c's in the low half; lim = seq_k - c: columns at or past
// seq_k read nothing (0). The conditions are on integers only, so a
// tile's loads issue together (predicated) and wait once.
__device__ __forceinline__ unsigned stof_bias_ld2(const unsigned short *row,
                                                  int c, int lim)
{
    unsigned u = 0u;
    if (lim >= 2) {
        asm("ld.global.nc.b32 %0, [%1];\n" : "=r"(u) : "l"(row + c));
    } else if (lim == 1) {
        unsigned short h;
        asm("ld.global.nc.u16 %0, [%1];\n" : "=h"(h) : "l"(row + c));
        u = h;
    }
    return u;
}

// The bias pair at p (4-byte aligned, both columns inside the row).
__device__ __forceinline__ unsigned stof_bias_ld2_full(const unsigned short *p)
{
    unsigned u;
    asm("ld.global.nc.b32 %0, [%1];\n" : "=r"(u) : "l"(p));
    return u;
}

// Add a pair from stof_bias_ld2 times mul (> 0: log2(e) for scores in
// log2 units, 1 / scale for raw q.k scores) to scores s0, s1. A masked
// score (-inf) stays -inf; a -inf bias masks its key.
__device__ __forceinline__ void stof_bias_add2(unsigned u, float &s0,
                                               float &s1, float mul)
{
    s0 = fmaf(stof_load_bits((unsigned short)(u & 0xffffu)), mul, s0);
    s1 = fmaf(stof_load_bits((unsigned short)(u >> 16)), mul, s1);
}

#ifdef STOF_JIT_FORCE_ERROR
#error "compile error forced by STOF_JIT_FORCE_ERROR"
#endif
