// sm90_pipes.cu - which instructions of one warpgroup slow the wgmma of
// another on the same SM (Hopper): the question behind every ping-pong
// epilogue (gemm_wgmma.cu) and every softmax next to a K loop
// (attn_wgmma.cu). Not built by meson (it needs nvcc); by hand:
//
//   nvcc -O3 -arch=sm_90a -I jit_templates -o /tmp/sm90_pipes \
//        bench/sm90_pipes.cu && /tmp/sm90_pipes
//
// One CTA an SM, 256 threads. Warpgroup 0 runs K-steps of a 128 x 128
// tile over 64 of K (two m64n128k16 wgmma x 4, from shared memory holding
// arbitrary data, accumulators in registers, one group kept in flight as
// gemm_wgmma.cu does) and times them with clock64; warpgroup 1 runs one
// kind of instruction in a loop until warpgroup 0 is done (one warp per
// SM sub-partition, as a ping-pong epilogue). Printed: SM cycles a K-step
// (512 is the dense fp16 peak, 1024 FLOP a cycle a sub-partition). Then
// the cost of the erf-GELU forms alone: cycles a value a warp, one warp a
// sub-partition (the epilogue's occupancy), 8 independent chains.
//
// A caution from its first use (bench/RESULTS.md, 2026-11-25): what it
// shows did not carry over to gemm_wgmma.cu's erf epilogue. The table form
// below, which leaves the K-step here at 513 cycles, made the 16384 x 3072
// x 768 erf GEMM 11% slower (ncu cycles, H200); the polynomial, which
// stretches the K-step here to 950, ran that GEMM as fast as A&S (600
// here). The GEMM's K loop also waits on mbarriers and TMA and shares
// shared memory with the stores; this loop does none of that.
#include <cstdio>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define DTYPE 0
#include "stof_common.cuh"
#include "sm90_common.cuh"
#include "stof_gelu.cuh"

__device__ __forceinline__ float sfu_ex2(float x)
{
    float y;
    asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float sfu_rcp(float x)
{
    float y;
    asm volatile("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ int mad_hi(int a, int b, int c)
{
    int d;
    asm volatile("mad.hi.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b),
                 "r"(c));
    return d;
}

// erf-GELU of 8 values: the templates' form (stof_gelu.cuh) and the one
// before it (Abramowitz & Stegun 7.1.26: an exp2 and a reciprocal).
__device__ __forceinline__ void gelu_now(float (&v)[8])
{
    float a[8], e[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        a[i] = stof_gelu_erf_clamp(v[i]);
#pragma unroll
    for (int i = 0; i < 8; i++)
        e[i] = sfu_ex2(stof_gelu_erf_exponent(v[i], a[i]));
#pragma unroll
    for (int i = 0; i < 8; i++)
        v[i] = stof_gelu_erf_finish(v[i], a[i], e[i]);
}

__device__ __forceinline__ void gelu_as(float (&v)[8])
{
    float t[8], e[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        t[i] = sfu_rcp(fmaf(0.23164189f, fabsf(v[i]), 1.0f));
        e[i] = sfu_ex2(v[i] * v[i] * -0.72134752f);
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float p = fmaf(0.5307027145f, t[i], -0.7265760135f);
        p = fmaf(p, t[i], 0.7107068705f);
        p = fmaf(p, t[i], -0.1422483680f);
        p = fmaf(p, t[i], 0.1274147960f);
        t[i] *= p * e[i];
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
        v[i] *= v[i] >= 0.0f ? 1.0f - t[i] : t[i];
}

// erf-GELU by table: h(a) = log2 Phi(-a) linear on 1536 pieces of 1/256
// (x = 256 a, h = s x + c: one FMA; the index and x from a's bits without
// FP32 arithmetic), table (c, s) in shared memory: an LDS.64 a value.
#define TAB_N 1536
__device__ __forceinline__ float tab_h(float a)
{
    const float ac = fminf(a, STOF_GELU_T);
    return fmaf(STOF_GELU_K, ac, stof_gelu_erf_exponent(ac, ac));
}

__device__ void tab_fill(float2 *tab, int tid, int nthreads)
{
    for (int i = tid; i < TAB_N; i += nthreads) {
        const float h0 = tab_h(i / 256.0f), h1 = tab_h((i + 1) / 256.0f);
        tab[i] = make_float2(h0 - (h1 - h0) * (float)i, h1 - h0);
    }
}

__device__ __forceinline__ void gelu_tab(float (&v)[8], const float2 *tab)
{
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float ac = fminf(fabsf(v[i]), 5.998f);
        const float x = __int_as_float(__float_as_int(ac) + (8 << 23));
        const float2 cs = tab[__float2int_rz(x)];
        float e = sfu_ex2(fmaf(cs.y, x, cs.x));
        e = fabsf(v[i]) < 5.998f ? e : 0.0f;
        v[i] = fmaf(-ac, e, fmaxf(v[i], 0.0f));
    }
}

enum {
    M_IDLE, M_FFMA, M_FADD, M_HFMA2, M_H2F, M_F2FP, M_FMNMX, M_FSEL, M_LOP,
    M_IMAD_HI, M_CVT, M_EX2, M_TANH, M_LDS, M_GELU, M_GELU_AS, M_GELU_TAB,
    M_N
};
static const char *const mode_name[M_N] = {
    "idle", "FFMA", "FADD (register + immediate)", "HFMA2",
    "half -> float (HADD2.F32)", "float pair -> half2 (F2FP)", "FMNMX",
    "FSETP + FSEL", "LOP3 / SHF", "mad.hi.s32 (IMAD.HI)", "F2I + I2F",
    "SFU ex2", "SFU tanh", "LDS.64, random index, 12 KB",
    "erf-GELU (stof_gelu.cuh)",
    "erf-GELU (A&S 7.1.26)", "erf-GELU (12 KB table)"};

template <int MODE>
__device__ __forceinline__ void gelu_form(float (&w)[8], const float2 *tab)
{
    if (MODE == M_GELU)
        gelu_now(w);
    else if (MODE == M_GELU_AS)
        gelu_as(w);
    else
        gelu_tab(w, tab);
}

template <int MODE>
__device__ __forceinline__ void work(float (&v)[64], const float2 *tab)
{
    // four passes between the checks of the done flag: the warp issues
    // about an instruction a cycle where the pipe allows
#pragma unroll
    for (int k = 0; k < 4 * 64; k++) {
        const int i = k & 63;
        const int j = (i + 1) & 63;
        if (MODE == M_FFMA)
            v[i] = fmaf(v[i], v[j], 0.001f);
        else if (MODE == M_FADD)
            v[i] = v[i] + 0.001f;
        else if (MODE == M_HFMA2) {
            __half2 *h = (__half2 *)v;
            h[i] = __hfma2(h[i], h[j], __float2half2_rn(0.001f));
        } else if (MODE == M_H2F) {
            const unsigned short b = (unsigned short)__float_as_uint(v[j]);
            v[i] = __uint_as_float(
                __float_as_uint(__half2float(*(const __half *)&b)) ^
                __float_as_uint(v[i]));
        } else if (MODE == M_F2FP) {
            const __half2 p = __floats2half2_rn(v[i], v[j]);
            v[i] = __uint_as_float(__float_as_uint(v[i]) ^
                                   *(const unsigned *)&p);
        } else if (MODE == M_FMNMX)
            v[i] = fminf(v[i], v[j]);
        else if (MODE == M_FSEL)
            v[i] = v[i] > v[(i + 5) & 63] ? v[j] : v[(i + 2) & 63];
        else if (MODE == M_LOP)
            v[i] = __uint_as_float(__float_as_uint(v[i]) ^
                                   (__float_as_uint(v[(i + 3) & 63]) >> 1));
        else if (MODE == M_IMAD_HI)
            v[i] = __int_as_float(
                mad_hi(__float_as_int(v[i]), __float_as_int(v[j]), 12345));
        else if (MODE == M_CVT)
            v[i] = __int2float_rn(__float2int_rz(v[i]) ^ 7);
        else if (MODE == M_EX2)
            v[i] = sfu_ex2(v[i]);
        else if (MODE == M_TANH)
            asm volatile("tanh.approx.f32 %0, %1;" : "=f"(v[i]) : "f"(v[i]));
    }
    if (MODE == M_LDS)
#pragma unroll
        for (int i = 0; i < 64; i++) {
            const float2 t =
                tab[(__float_as_uint(v[i]) * 2654435761u) % TAB_N];
            v[i] = t.x + t.y;
        }
    if (MODE == M_GELU || MODE == M_GELU_AS || MODE == M_GELU_TAB) {
#pragma unroll
        for (int j = 0; j < 64; j += 8) {
            float w[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                w[i] = v[j + i];
            gelu_form<MODE>(w, tab);
#pragma unroll
            for (int i = 0; i < 8; i++)
                v[j + i] = w[i] + 0.5f;
        }
    }
}

template <int MODE>
__global__ void __launch_bounds__(256, 1)
    interference(float *out, long long *cycles, int ksteps)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) char smem[];
    volatile int *done = (volatile int *)(smem + 65536);
    unsigned base = (unsigned)__cvta_generic_to_shared(smem);
    base = (base + 1023) & ~1023u;
    for (int i = threadIdx.x; i < 65536 / 4; i += 256)
        ((unsigned *)smem)[i] = 0x3c003c00u * (i & 1);
    if (threadIdx.x == 0)
        *done = 0;
    const unsigned raw = (unsigned)__cvta_generic_to_shared(smem);
    float2 *tab = (float2 *)(smem + 32768 + (base - raw));
    __syncthreads();
    tab_fill(tab, threadIdx.x, 256);
    __syncthreads();
    float s = 0.0f;
    if (threadIdx.x < 128) {
        float acc[2][64];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int i = 0; i < 64; i++)
                acc[h][i] = 0.0f;
        long long t0 = 0;
        for (int k = 0; k < ksteps + 8; k++) { // 8 warm-up K-steps
            if (k == 8) {
                wg_wait<0>();
                t0 = clock64();
            }
            wg_fence();
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    wg_mma_ss(acc[h], wg_desc(base + h * 8192 + kk * 32, 16,
                                              1024),
                              wg_desc(base + 16384 + kk * 32, 16, 1024), 1);
            wg_commit();
            wg_wait<1>();
        }
        wg_wait<0>();
#pragma unroll
        for (int h = 0; h < 2; h++)
            wg_keep(acc[h]);
        const long long t1 = clock64();
        if (threadIdx.x == 0) {
            *done = 1;
            cycles[blockIdx.x] = t1 - t0;
        }
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int i = 0; i < 64; i++)
                s += acc[h][i];
    } else {
        float v[64];
#pragma unroll
        for (int i = 0; i < 64; i++)
            v[i] = (float)(threadIdx.x * 7 + i) * 0.01f - 3.0f;
        if (MODE != M_IDLE)
            while (!*done)
                work<MODE>(v, tab);
#pragma unroll
        for (int i = 0; i < 64; i++)
            s += v[i];
    }
    out[blockIdx.x * 256 + threadIdx.x] = s;
#endif
}

// erf-GELU alone: 128 values a thread, 8 at a time, reps times.
template <int MODE>
__global__ void alone(float *out, long long *cycles, int reps)
{
    __shared__ float2 tab[TAB_N];
    tab_fill(tab, threadIdx.x, blockDim.x);
    __syncthreads();
    float v[128];
#pragma unroll
    for (int i = 0; i < 128; i++)
        v[i] = (float)((threadIdx.x * 131 + i * 37) % 1000) * 0.01f - 5.0f;
    __syncwarp();
    const long long t0 = clock64();
    for (int r = 0; r < reps; r++)
#pragma unroll
        for (int j = 0; j < 128; j += 8) {
            float w[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                w[i] = v[j + i] + 0.001f;
            gelu_form<MODE>(w, tab);
#pragma unroll
            for (int i = 0; i < 8; i++)
                v[j + i] = w[i] * 0.5f;
        }
    __syncwarp();
    const long long t1 = clock64();
    float s = 0.0f;
    for (int i = 0; i < 128; i++)
        s += v[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if ((threadIdx.x & 31) == 0)
        cycles[(blockIdx.x * blockDim.x + threadIdx.x) / 32] = t1 - t0;
}

static int n_sm;

static double mean_of(const long long *d, int n)
{
    std::vector<long long> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(long long), cudaMemcpyDeviceToHost);
    double m = 0;
    for (long long c : h)
        m += (double)c;
    return m / n;
}

template <int MODE> static void run_interference(float *out, long long *cyc)
{
    const int ksteps = 4000, smem = 65536 + 2048;
    cudaFuncSetAttribute(interference<MODE>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    for (int i = 0; i < 2; i++) // the first launch warms up
        interference<MODE><<<n_sm, 256, smem>>>(out, cyc, ksteps);
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("%-32s %s\n", mode_name[MODE], cudaGetErrorString(e));
        return;
    }
    printf("%-32s %7.1f\n", mode_name[MODE], mean_of(cyc, n_sm) / ksteps);
}

template <int MODE> static void run_alone(float *out, long long *cyc)
{
    const int reps = 200;
    for (int i = 0; i < 2; i++)
        alone<MODE><<<n_sm, 128>>>(out, cyc, reps);
    cudaDeviceSynchronize();
    printf("%-32s %7.2f\n", mode_name[MODE],
           mean_of(cyc, n_sm * 4) / (reps * 128.0));
}

int main()
{
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9) {
        printf("sm90_pipes: needs a compute capability 9.0 GPU\n");
        return 77;
    }
    n_sm = prop.multiProcessorCount;
    float *out;
    long long *cyc;
    cudaMalloc(&out, n_sm * 256 * sizeof(float));
    cudaMalloc(&cyc, n_sm * 4 * sizeof(long long));
    printf("%s: SM cycles a 128x128x64 K-step of warpgroup 0 while "
           "warpgroup 1 runs\n",
           prop.name);
    run_interference<M_IDLE>(out, cyc);
    run_interference<M_FFMA>(out, cyc);
    run_interference<M_FADD>(out, cyc);
    run_interference<M_HFMA2>(out, cyc);
    run_interference<M_H2F>(out, cyc);
    run_interference<M_F2FP>(out, cyc);
    run_interference<M_FMNMX>(out, cyc);
    run_interference<M_FSEL>(out, cyc);
    run_interference<M_LOP>(out, cyc);
    run_interference<M_IMAD_HI>(out, cyc);
    run_interference<M_CVT>(out, cyc);
    run_interference<M_EX2>(out, cyc);
    run_interference<M_TANH>(out, cyc);
    run_interference<M_GELU>(out, cyc);
    run_interference<M_GELU_AS>(out, cyc);
    run_interference<M_LDS>(out, cyc);
    run_interference<M_GELU_TAB>(out, cyc);
    printf("cycles a value a warp, alone (one warp a sub-partition)\n");
    run_alone<M_GELU>(out, cyc);
    run_alone<M_GELU_AS>(out, cyc);
    run_alone<M_GELU_TAB>(out, cyc);
    cudaFree(out);
    cudaFree(cyc);
    return 0;
}
