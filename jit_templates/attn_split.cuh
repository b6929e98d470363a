// attn_split.cuh - split-KV: the partial results of the attention kernels
// built with SPLIT=1, and the kernel that merges them.
//
// With SPLIT=1 an attention kernel (attn_block.cu, attn_wgmma.cu) runs
// gridDim.z = n_split CTAs per (row block, batch * head): CTA z walks
// tiles lo .. hi - 1 of its row block's n non-empty tiles, lo = n * z /
// n_split, hi = n * (z + 1) / n_split (an empty range is fine), and
// instead of O it writes, for each query row of the tensors (after any
// QPERM), its normalised partial output and log-sum-exp:
//   o_part  [z][b * heads + h][row][HEAD_DIM] fp32: O_z / l_z (0 if l_z = 0)
//   lse_part[z][b * heads + h][row]           fp32: m_z + ln l_z (-inf: no
//                                               allowed key in the range)
// stof_attn_combine then merges the n_split partials of each row:
//   M = max_z lse_z,  w_z = exp(lse_z - M),  O = sum_z w_z O_z / sum_z w_z,
//   lse = M + ln sum_z w_z,
// writes O (16-bit, the tensor strides) and, when lse is not NULL, the
// row's log-sum-exp; a row whose every partial is -inf gets zeros and -inf,
// as an unsplit kernel gives. One warp per (batch * head, row); lane l
// holds columns l * HEAD_DIM/32 .. of the row.
//
// This is a short-queries-long-keys path (decode, chunked prefill): the
// workspace is n_split * batch * heads * seq_q * (HEAD_DIM + 1) floats,
// which the host sizes for the plan's largest problem.
#ifndef STOF_ATTN_SPLIT_CUH
#define STOF_ATTN_SPLIT_CUH

#include "stof_common.cuh"

// The merge kernel's parameters, by value. Mirrored by
// stof_attn_combine_params in src/kernels/attn_split.c.
struct stof_attn_combine_params {
    const float *o_part;  // [n_split][batch * heads][seq_q][HEAD_DIM]
    const float *lse_part; // [n_split][batch * heads][seq_q]
    unsigned short *o;    // output, the attention kernel's strides
    float *lse;           // NULL, or [batch][heads][seq_q]
    stof_i64 o_stride[3]; // b, h, seq (elements)
    int batch, heads, seq_q, n_split;
};
static_assert(sizeof(stof_attn_combine_params) == 4 * 8 + 3 * 8 + 4 * 4,
              "stof_attn_combine_params layout");

// CTA blockIdx.z's share lo .. hi - 1 of a row block's n tiles. The host
// launches gridDim.z = n_split >= 1; the clamps keep any other launch
// inside the row block.
__device__ __forceinline__ void stof_split_range(int n, int n_split, int &lo,
                                                 int &hi)
{
    const stof_i64 z = blockIdx.z, ns = n_split > 1 ? n_split : 1;
    lo = (int)min((stof_i64)n * z / ns, (stof_i64)n);
    hi = (int)min((stof_i64)n * (z + 1) / ns, (stof_i64)n);
}

// Store one fragment pair of a split partial: columns c, c + 1 of row
// `row` (a tensor row) of split z, already divided by the row's l.
__device__ __forceinline__ void stof_split_store2(float *o_part, int z,
                                                  stof_i64 bh_rows,
                                                  stof_i64 row, int c,
                                                  float v0, float v1)
{
    *(float2 *)(o_part + ((stof_i64)z * bh_rows + row) * HEAD_DIM + c) =
        make_float2(v0, v1);
}

extern "C" __global__ void __launch_bounds__(128)
    stof_attn_combine(const stof_attn_combine_params p)
{
    stof_grid_wait(); // programmatic dependent launch: see stof_common.cuh
    stof_grid_release();
    constexpr int CPL = HEAD_DIM / 32; // columns per lane: 1, 2, 4 or 8
    const int lane = threadIdx.x & 31;
    const stof_i64 bh_rows = (stof_i64)p.batch * p.heads * p.seq_q;
    const stof_i64 w = (stof_i64)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (w >= bh_rows)
        return;
    const stof_i64 bh = w / p.seq_q;
    const int row = (int)(w - bh * p.seq_q);
    float mx = STOF_NEG_INF;
    for (int z = 0; z < p.n_split; z++)
        mx = fmaxf(mx, p.lse_part[z * bh_rows + w]);
    float acc[CPL];
#pragma unroll
    for (int i = 0; i < CPL; i++)
        acc[i] = 0.0f;
    float wsum = 0.0f;
    if (mx != STOF_NEG_INF) {
        for (int z = 0; z < p.n_split; z++) {
            const float lz = p.lse_part[z * bh_rows + w];
            if (lz == STOF_NEG_INF)
                continue;
            const float wz = __expf(lz - mx);
            wsum += wz;
            const float *src =
                p.o_part + (z * bh_rows + w) * HEAD_DIM + lane * CPL;
#pragma unroll
            for (int i = 0; i < CPL; i++)
                acc[i] += wz * src[i];
        }
    }
    const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
    const int b = (int)(bh / p.heads), h = (int)(bh - (stof_i64)b * p.heads);
    unsigned short *og = p.o + b * p.o_stride[0] + h * p.o_stride[1] +
                         (stof_i64)row * p.o_stride[2] + lane * CPL;
#pragma unroll
    for (int i = 0; i + 1 < CPL; i += 2)
        *(unsigned *)(og + i) = stof_pack2(acc[i] * inv, acc[i + 1] * inv);
    if (CPL == 1)
        og[0] = (unsigned short)(stof_pack2(acc[0] * inv, 0.0f) & 0xffffu);
    if (p.lse && lane == 0)
        p.lse[w] = wsum > 0.0f ? mx + __logf(wsum) : STOF_NEG_INF;
}

#endif
