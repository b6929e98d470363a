/* stof_gelu.cuh - erf-GELU as the GEMM templates evaluate it (gemm_epi.cuh),
 * in C that NVRTC and the host's C11 compiler both take, so the host tests
 * check the very formula the kernels run (tests/test_gemm_cpu.c).
 *
 * gelu(v) = v Phi(v). With a = |v|, Phi(-a) = 2^h(a) and Phi(a) = 1 -
 * 2^h(a), so gelu(v) = max(v, 0) - a 2^h(a): one exp2 (the SFU's ex2) and
 * a polynomial. Abramowitz & Stegun 7.1.26, used before, took an exp2 and
 * a reciprocal and had a fixed absolute error (1.5e-7 of Phi), so large
 * relative errors in the negative tail; in isolation (H100, a warp a
 * sub-partition) it took 34 cycles a value a warp, this 15. In the
 * ping-pong GEMM (gemm_wgmma.cu) both cost the same: there an epilogue's
 * FMA-pipe and SFU instructions stretch the other warpgroup's K loop
 * (bench/RESULTS.md, 2026-11-25, per activation). h is a degree-7
 * polynomial, minimax on [0, T] (T = 5.5, Phi(-T) = 1.9e-8), evaluated
 * at min(a, T); past T the exponent falls by K = 8 a unit (2^-8 of Phi a
 * unit of v), so gelu goes to 0 far below instead of to v Phi(-T). K a is
 * folded into the linear coefficient and subtracted again at a itself:
 * one FMA. Errors (fp32, ex2.approx), over v in [-12, 12]: absolute at
 * most 6e-7, relative at most 6e-6 wherever |gelu| > 1e-6
 * (tests/test_gemm_cpu.c bounds both); the product takes min(a, T) as
 * well, so +inf gives +inf and -inf gives 0 (the limit), NaN stays NaN. */
#ifndef STOF_GELU_CUH
#define STOF_GELU_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define STOF_GELU_FN __device__ __forceinline__
#else
#define STOF_GELU_FN static inline
#endif

#define STOF_GELU_T 5.5f
#define STOF_GELU_K 8.0f

/* min(|v|, T): the polynomial's argument and the product's factor. */
STOF_GELU_FN float stof_gelu_erf_clamp(float v)
{
    return fminf(fabsf(v), STOF_GELU_T);
}

/* The exponent: h(ac) - K (|v| - ac), h as above (Horner, coefficients of
 * ac^0 .. ac^7, K in the linear one). */
STOF_GELU_FN float stof_gelu_erf_exponent(float v, float ac)
{
    float p = -1.793473302e-06f;
    p = fmaf(p, ac, 6.090450188e-05f);
    p = fmaf(p, ac, -9.260313236e-04f);
    p = fmaf(p, ac, 8.493765257e-03f);
    p = fmaf(p, ac, -5.393785983e-02f);
    p = fmaf(p, ac, -4.584805071e-01f);
    p = fmaf(p, ac, 6.848752975e+00f); /* -1.151247025 + K */
    p = fmaf(p, ac, -9.999954700e-01f);
    return fmaf(-STOF_GELU_K, fabsf(v), p);
}

/* gelu(v) from e = 2^exponent. */
STOF_GELU_FN float stof_gelu_erf_finish(float v, float ac, float e)
{
    return fmaf(-ac, e, fmaxf(v, 0.0f));
}

#endif
