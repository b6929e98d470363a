// gemm_epi.cuh - the GEMM templates' epilogue pieces (gemm.cu,
// gemm_wgmma.cu): the epilogue switches' defaults, 16-bit pairs to float
// and the activation ACT (0 none, 1 gelu (tanh), 2 gelu (erf), 3 relu,
// 4 silu: stof_activation). Compiled by NVRTC only.
#pragma once

#include "stof_common.cuh"

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

// erf(x) by Abramowitz & Stegun 7.1.26 (absolute error at most 1.5e-7),
// with the fast reciprocal and exp2 (a few fp32 ulp more): branch-free and
// about a tenth of erff's instructions, far below the output's fp16 / bf16
// rounding. The epilogue of an FFN's first GEMM evaluates it on every
// element, where erff cost more than the GEMM's own K loop at K = 768.
__device__ __forceinline__ float gm_erf(float x)
{
    const float ax = fabsf(x);
    const float t = __fdividef(1.0f, fmaf(0.3275911f, ax, 1.0f));
    float y = fmaf(1.061405429f, t, -1.453152027f);
    y = fmaf(y, t, 1.421413741f);
    y = fmaf(y, t, -0.284496736f);
    y = fmaf(y, t, 0.254829592f);
    y *= t;
    const float r = fmaf(-y, gm_exp2(-ax * ax * 1.4426950408889634f), 1.0f);
    return copysignf(r, x);
}

// tanh(u) = 1 - 2 / (e^{2u} + 1) with the fast exp2 and division: exact
// limits (+-1, never NaN), absolute error about 1e-7.
__device__ __forceinline__ float gm_tanh(float u)
{
    return 1.0f - __fdividef(2.0f,
                             gm_exp2(u * 2.8853900817779268f) + 1.0f);
}

__device__ __forceinline__ float gm_act(float v)
{
#if ACT == 1
    const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    return 0.5f * v * (1.0f + gm_tanh(u));
#elif ACT == 2
    return 0.5f * v * (1.0f + gm_erf(v * 0.7071067811865476f));
#elif ACT == 3
    return v > 0.0f ? v : 0.0f;
#elif ACT == 4
    // v / (1 + e^-v); the fast division gives 0 once e^-v passes 2^126
    // (v < -87), where SiLU is below 1e-36: 0 in fp16, and an absolute
    // error under 1e-36 in bf16.
    return __fdividef(v, 1.0f + gm_exp2(-v * 1.4426950408889634f));
#else
    return v;
#endif
}
