// attn_reference.cu - the masked-attention reference kernel. Simple and
// exact rather than fast: one warp per (batch, head, query row), fp32
// accumulation, online softmax over exactly the allowed keys (walking the
// bit-packed mask row word by word). Every tuned kernel is verified against
// it. A query row with no allowed key writes zeros.
//
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0 | HEAD_DIM=128,DTYPE=1 | HEAD_DIM=40,DTYPE=0 | HEAD_DIM=256,DTYPE=1
#include "stof_common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define STOF_REF_WARPS 4
#define STOF_REF_PER_LANE ((HEAD_DIM + 31) / 32)

extern "C" __global__ void __launch_bounds__(32 * STOF_REF_WARPS)
stof_attn_reference(const stof_attn_params p)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * STOF_REF_WARPS + (threadIdx.x >> 5);
    if (row >= p.seq_q)
        return;
    const int bh = blockIdx.y;
    const int b = bh / p.heads, h = bh % p.heads;

    const unsigned short *q = p.q + b * p.q_stride[0] + h * p.q_stride[1] +
                              (stof_i64)row * p.q_stride[2];
    const unsigned short *kb = p.k + b * p.k_stride[0] + h * p.k_stride[1];
    const unsigned short *vb = p.v + b * p.v_stride[0] + h * p.v_stride[1];
    unsigned short *o = p.o + b * p.o_stride[0] + h * p.o_stride[1] +
                        (stof_i64)row * p.o_stride[2];

    float qr[STOF_REF_PER_LANE], acc[STOF_REF_PER_LANE];
#pragma unroll
    for (int i = 0; i < STOF_REF_PER_LANE; i++) {
        const int d = lane + 32 * i;
        qr[i] = d < HEAD_DIM ? stof_load(q + d) * p.scale : 0.0f;
        acc[i] = 0.0f;
    }

    float m = STOF_NEG_INF, l = 0.0f;
    const stof_u64 *bits = p.mask_bits + (stof_i64)row * p.mask_words;
    for (int w = 0; w < p.mask_words; w++) {
        stof_u64 word = bits[w];
        while (word) {
            const int key = w * 64 + (__ffsll((long long)word) - 1);
            word &= word - 1;
            const unsigned short *kr = kb + (stof_i64)key * p.k_stride[2];
            const unsigned short *vr = vb + (stof_i64)key * p.v_stride[2];
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < STOF_REF_PER_LANE; i++) {
                const int d = lane + 32 * i;
                if (d < HEAD_DIM)
                    s += qr[i] * stof_load(kr + d);
            }
            s = stof_warp_sum(s);
            const float m_new = fmaxf(m, s);
            const float alpha = expf(m - m_new); // 0 on the first key
            const float pr = expf(s - m_new);
            l = l * alpha + pr;
#pragma unroll
            for (int i = 0; i < STOF_REF_PER_LANE; i++) {
                const int d = lane + 32 * i;
                if (d < HEAD_DIM)
                    acc[i] = acc[i] * alpha + pr * stof_load(vr + d);
            }
            m = m_new;
        }
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < STOF_REF_PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < HEAD_DIM)
            stof_store(o + d, acc[i] * inv);
    }
}
