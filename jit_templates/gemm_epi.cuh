// gemm_epi.cuh - the GEMM templates' epilogue pieces (gemm.cu,
// gemm_wgmma.cu): the epilogue switches' defaults, 16-bit pairs to float
// and the activation ACT (0 none, 1 gelu (tanh), 2 gelu (erf), 3 relu,
// 4 silu: stof_activation). Compiled by NVRTC only.
#pragma once

#include "stof_common.cuh"
#include "stof_gelu.cuh"

#ifndef BIAS
#define BIAS 0
#endif
#ifndef ACT
#define ACT 0
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif

// The low and high 16-bit values of a pair, as float.
__device__ __forceinline__ float gm_lo(unsigned x)
{
    return stof_load_bits((unsigned short)(x & 0xffffu));
}

__device__ __forceinline__ float gm_hi(unsigned x)
{
    return stof_load_bits((unsigned short)(x >> 16));
}

// 2^x with the SFU (ex2.approx: about 2 ulp; +0 far below, +inf far
// above).
__device__ __forceinline__ float gm_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// 1/x with the SFU (rcp.approx: 1 ulp; 1/inf = 0, results below 2^-126
// flushed to 0). The activations below divide only by values >= 1, where
// __fdividef's extra range checks (three instructions) never apply.
__device__ __forceinline__ float gm_rcp(float x)
{
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// v = act(v) for N values at once, each step applied to all N before the
// next: N independent dependency chains, so the epilogue of a wgmma tile
// issues an instruction a cycle instead of waiting out each element's
// chain (measured, H100: the erf-GELU epilogue written element by element
// took twice the K loop of a 128 x 128 tile at K = 768, one dependent
// instruction every ~6 cycles). Formulas (all branch-free, SFU exp2 and
// reciprocal):
//   gelu (tanh)  0.5 v (1 + tanh(u)), u = sqrt(2/pi) (v + 0.044715 v^3),
//                is v sigmoid(2u) = v / (1 + 2^(-2u log2 e)): exact limits
//                (0 far below, v far above), absolute error about 1e-7.
//   gelu (erf)   v Phi(v) as max(v, 0) - |v| 2^h(|v|), h(a) = log2
//                Phi(-a) a polynomial (stof_gelu.cuh: one SFU exp2 and 9
//                FMA-pipe instructions; relative error at most 6e-6 where
//                |gelu| > 1e-6; A&S 7.1.26 before it took an exp2 and a
//                reciprocal and had 1.5e-7 of absolute error, so up to 0.2%
//                relative in the negative tail).
//   silu         v / (1 + 2^(-v log2 e)) (0 once the denominator passes
//                2^126, where SiLU is below 1e-36).
template <int N>
__device__ __forceinline__ void gm_act_n(float (&v)[N])
{
#if ACT == 1
    float e[N];
#pragma unroll
    for (int i = 0; i < N; i++)
        e[i] = v[i] * v[i];
    // -2 log2(e) sqrt(2/pi) (1 + 0.044715 v^2)
#pragma unroll
    for (int i = 0; i < N; i++)
        e[i] = fmaf(e[i], -0.10294324f, -2.3022082f) * v[i];
#pragma unroll
    for (int i = 0; i < N; i++)
        e[i] = gm_exp2(e[i]) + 1.0f;
#pragma unroll
    for (int i = 0; i < N; i++)
        v[i] *= gm_rcp(e[i]);
#elif ACT == 2
    float a[N], e[N];
#pragma unroll
    for (int i = 0; i < N; i++)
        a[i] = stof_gelu_erf_clamp(v[i]);
#pragma unroll
    for (int i = 0; i < N; i++)
        e[i] = gm_exp2(stof_gelu_erf_exponent(v[i], a[i]));
#pragma unroll
    for (int i = 0; i < N; i++)
        v[i] = stof_gelu_erf_finish(v[i], a[i], e[i]);
#elif ACT == 3
#pragma unroll
    for (int i = 0; i < N; i++)
        v[i] = v[i] > 0.0f ? v[i] : 0.0f;
#elif ACT == 4
    float e[N];
#pragma unroll
    for (int i = 0; i < N; i++)
        e[i] = gm_exp2(v[i] * -1.4426950408889634f) + 1.0f;
#pragma unroll
    for (int i = 0; i < N; i++)
        v[i] *= gm_rcp(e[i]);
#else
    (void)v;
#endif
}

__device__ __forceinline__ float gm_act(float v)
{
    float a[1] = {v};
    gm_act_n<1>(a);
    return a[0];
}
