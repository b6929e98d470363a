// sm90_common.cuh - Hopper (sm_90a) building blocks shared by the
// warp-specialised templates (attn_wgmma.cu, gemm_wgmma.cu): mbarriers,
// TMA and bulk copies, proxy fences, named barriers, wgmma descriptors and
// instructions. Compiled by NVRTC only. The helpers exist only when
// compiling for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); the tensor-map type
// always (launch parameters hold it).
#pragma once

#include "stof_common.cuh"

// An opaque CUtensorMap (128 bytes, 128-byte aligned as in cuda.h).
struct __align__(128) stof_tmap {
    stof_u64 w[16];
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void mb_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar),
                 "r"(count)
                 : "memory");
}

// One arrival that also expects `bytes` of asynchronous copies.
__device__ __forceinline__ void mb_expect_tx(unsigned bar, unsigned bytes)
{
    asm volatile(
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
        "r"(bytes)
        : "memory");
}

__device__ __forceinline__ void mb_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar)
                 : "memory");
}

// Wait until the phase with parity `parity` has completed.
__device__ __forceinline__ void mb_wait(unsigned bar, unsigned parity)
{
    unsigned done;
    do {
        asm volatile("{\n .reg .pred p;\n"
                     " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

// TMA: box at coordinates (c0, c1, c2, c3) of the 4-D map into `dst`,
// completing `bytes` of transactions on `bar`.
__device__ __forceinline__ void tma_load4(unsigned dst, const stof_tmap *map,
                                          int c0, int c1, int c2, int c3,
                                          unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile."
                 "mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
                 "[%6];\n" ::"r"(dst),
                 "l"((stof_u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
                 "r"(bar)
                 : "memory");
}

// 1-D bulk copy (16-byte aligned addresses, size a multiple of 16).
__device__ __forceinline__ void bulk_load(unsigned dst, const void *src,
                                          unsigned bytes, unsigned bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx"
                 "::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const stof_tmap *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((stof_u64)map) : "memory");
}

// TMA: box at coordinates (c0, c1) of a 2-D map into `dst`.
__device__ __forceinline__ void tma_load2(unsigned dst, const stof_tmap *map,
                                          int c0, int c1, unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile."
                 "mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"((stof_u64)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

// TMA multicast: the box at (c0, c1) into `dst` of every CTA of the
// cluster whose bit is set in `mask`, completing bytes on the mbarrier at
// `bar`'s offset in each of them.
__device__ __forceinline__ void tma_load2_mc(unsigned dst, const stof_tmap *map,
                                             int c0, int c1, unsigned bar,
                                             unsigned short mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile."
                 "mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
                 "{%2, %3}], [%4], %5;\n" ::"r"(dst),
                 "l"((stof_u64)map), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
                 : "memory");
}

// This CTA's rank in its cluster.
__device__ __forceinline__ unsigned cluster_rank()
{
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

// Every thread of every CTA of the cluster (release / acquire).
__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// One arrival on the mbarrier at `bar`'s offset in the cluster's CTA of
// rank `rank`, with the default release at CTA scope: a cluster-scope
// release fences every arrival (measured: half the warps' stalls of a
// GEMM K loop, twice its time), and the slot's reader here is the peer's
// TMA, ordered by the barrier itself.
__device__ __forceinline__ void mb_arrive_rank(unsigned bar, unsigned rank)
{
    asm volatile("{\n .reg .b32 ra;\n"
                 " mapa.shared::cluster.u32 ra, %0, %1;\n"
                 " mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n"
                 ::"r"(bar),
                 "r"(rank)
                 : "memory");
}

// TMA store: the box at `src` to coordinates (c0, c1) of a 2-D map (rows
// and columns outside the map are not written), in this thread's current
// bulk group.
__device__ __forceinline__ void tma_store2(const stof_tmap *map, int c0,
                                           int c1, unsigned src)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group "
                 "[%0, {%1, %2}], [%3];\n" ::"l"((stof_u64)map),
                 "r"(c0), "r"(c1), "r"(src)
                 : "memory");
}

// Four 8 x 8 matrices of 16-bit values from registers to shared memory
// (a warp): register i of lane t holds row t / 4, columns 2 (t % 4) and
// 2 (t % 4) + 1 of matrix i (an mma accumulator fragment's layout, packed);
// lane t gives the address of row t % 8 of matrix t / 8.
__device__ __forceinline__ void st_matrix4(unsigned addr, unsigned r0,
                                           unsigned r1, unsigned r2,
                                           unsigned r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], "
                 "{%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

// The converse of st_matrix4: the same fragments loaded.
__device__ __forceinline__ void ld_matrix4(unsigned addr, unsigned &r0,
                                           unsigned &r1, unsigned &r2,
                                           unsigned &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
                 "{%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ void bulk_commit()
{
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Wait until all but the newest N of this thread's bulk groups have read
// their shared memory (those sources may be written again).
template <int N>
__device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Wait until this thread's bulk groups have completed.
__device__ __forceinline__ void bulk_wait0()
{
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Generic-proxy shared-memory writes -> visible to the async proxy (wgmma
// operand reads after cp.async, TMA stores of what threads wrote).
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void named_bar_sync(int id, int count)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// ---------------------------------------------------------------------------
// wgmma
// ---------------------------------------------------------------------------

#if DTYPE == 0
#define WG_AB ".f16.f16"
#else
#define WG_AB ".bf16.bf16"
#endif

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading
// and stride byte offsets (all >> 4), swizzle mode 1 in bits 62..63.
__device__ __forceinline__ stof_u64 wg_desc(unsigned addr, unsigned lbo,
                                            unsigned sbo)
{
    return (stof_u64)((addr & 0x3ffffu) >> 4) |
           ((stof_u64)((lbo >> 4) & 0x3fffu) << 16) |
           ((stof_u64)((sbo >> 4) & 0x3fffu) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wg_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keep the compiler from moving accesses of x across a wgmma wait.
template <int N> __device__ __forceinline__ void wg_keep(float (&x)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(x[i])::"memory");
}

#define WG_F8(d, i)                                                           \
    "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]),   \
        "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define WG_F32(d) WG_F8(d, 0), WG_F8(d, 8), WG_F8(d, 16), WG_F8(d, 24)
#define WG_F64(d)                                                             \
    WG_F32(d), WG_F8(d, 32), WG_F8(d, 40), WG_F8(d, 48), WG_F8(d, 56)
#define WG_R32                                                                \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,"  \
    "%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define WG_R64                                                                \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,"  \
    "%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37," \
    "%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55," \
    "%56,%57,%58,%59,%60,%61,%62,%63}"

// D (64 x N, f32) (+)= A (64 x 16, smem, K-major) * B (16 x N, smem,
// K-major); accum 0 overwrites D.
__device__ __forceinline__ void wg_mma_ss(float (&d)[32], stof_u64 da,
                                          stof_u64 db, int accum)
{
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n64k16.f32" WG_AB
                 " " WG_R32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WG_F32(d)
                 : "l"(da), "l"(db), "r"(accum));
}

__device__ __forceinline__ void wg_mma_ss(float (&d)[64], stof_u64 da,
                                          stof_u64 db, int accum)
{
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n128k16.f32" WG_AB
                 " " WG_R64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_F64(d)
                 : "l"(da), "l"(db), "r"(accum));
}

#define WG_F96(d)                                                             \
    WG_F64(d), WG_F8(d, 64), WG_F8(d, 72), WG_F8(d, 80), WG_F8(d, 88)
#define WG_R96                                                                \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18," \
    "%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35," \
    "%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52," \
    "%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69," \
    "%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86," \
    "%87,%88,%89,%90,%91,%92,%93,%94,%95}"

__device__ __forceinline__ void wg_mma_ss(float (&d)[96], stof_u64 da,
                                          stof_u64 db, int accum)
{
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %98, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n192k16.f32" WG_AB
                 " " WG_R96 ", %96, %97, p, 1, 1, 0, 0;\n}\n"
                 : WG_F96(d)
                 : "l"(da), "l"(db), "r"(accum));
}

#define WG_F128(d)                                                            \
    WG_F64(d), WG_F8(d, 64), WG_F8(d, 72), WG_F8(d, 80), WG_F8(d, 88),        \
        WG_F8(d, 96), WG_F8(d, 104), WG_F8(d, 112), WG_F8(d, 120)
#define WG_R128                                                               \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,"  \
    "%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37," \
    "%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55," \
    "%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73," \
    "%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91," \
    "%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,"      \
    "%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,"   \
    "%121,%122,%123,%124,%125,%126,%127}"

__device__ __forceinline__ void wg_mma_ss(float (&d)[128], stof_u64 da,
                                          stof_u64 db, int accum)
{
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n256k16.f32" WG_AB
                 " " WG_R128 ", %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : WG_F128(d)
                 : "l"(da), "l"(db), "r"(accum));
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL
