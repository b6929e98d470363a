// attn_reference.cu - the masked-attention reference kernels. Simple and
// exact rather than fast: one warp per (batch, head, query row), fp32
// accumulation, online softmax over exactly the allowed keys. Every tuned
// kernel is verified against them. A query row with no allowed key writes
// zeros.
//   stof_attn_reference         the mask as a bit matrix (64-bit words)
//   stof_attn_reference_family  a mask family: the allowed keys evaluated
//                               from the family's program and instance data
//                               (mask_eval.cuh), no bit matrix anywhere
// and two helpers of the search on long problems (no host copies):
//   stof_ref_fill               seeded random values in [-amp, amp]
//   stof_ref_diff               squared error and reference norm of two
//                               outputs over some heads
//
// STOF_VARIANTS: HEAD_DIM=64,DTYPE=0 | HEAD_DIM=128,DTYPE=1 | HEAD_DIM=40,DTYPE=0 | HEAD_DIM=256,DTYPE=1
#include "mask_eval.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define STOF_REF_WARPS 4
#define STOF_REF_PER_LANE ((HEAD_DIM + 31) / 32)

// One query row of one (batch, head): the keys are the set bits of the
// 32-bit words words(w), w in 0 .. n_words - 1 (words(w) may return 0 for
// words it knows to be empty).
template <class Words>
__device__ __forceinline__ void stof_ref_row(const stof_attn_params &p, int b,
                                             int h, int row, int n_words,
                                             Words words)
{
    const int lane = threadIdx.x & 31;
    const unsigned short *q = p.q + b * p.q_stride[0] + h * p.q_stride[1] +
                              (stof_i64)row * p.q_stride[2];
    const int hk = h / (p.kv_group > 1 ? p.kv_group : 1); // K/V head (GQA)
    const unsigned short *kb = p.k + b * p.k_stride[0] + hk * p.k_stride[1];
    const unsigned short *vb = p.v + b * p.v_stride[0] + hk * p.v_stride[1];
    unsigned short *o = p.o + b * p.o_stride[0] + h * p.o_stride[1] +
                        (stof_i64)row * p.o_stride[2];
    const unsigned short *bias_row =
        p.bias ? p.bias + b * p.bias_stride[0] + h * p.bias_stride[1] +
                     (stof_i64)row * p.bias_stride[2]
               : p.bias;

    float qr[STOF_REF_PER_LANE], acc[STOF_REF_PER_LANE];
#pragma unroll
    for (int i = 0; i < STOF_REF_PER_LANE; i++) {
        const int d = lane + 32 * i;
        qr[i] = d < HEAD_DIM ? stof_load(q + d) * p.scale : 0.0f;
        acc[i] = 0.0f;
    }

    float m = STOF_NEG_INF, l = 0.0f;
    for (int w = 0; w < n_words; w++) {
        unsigned word = words(w);
        while (word) {
            const int key = w * 32 + (__ffs((int)word) - 1);
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
            if (p.softcap > 0.0f)
                s = p.softcap * tanhf(s / p.softcap);
            if (p.alibi)
                s += p.alibi[h] * (float)(key - row);
            if (p.bias) { // additive bias; -inf masks the key, and so does a
                          // value that overflows once scaled by log2(e), as
                          // in the fast kernels (bf16's most negative)
                const float bv = stof_load(bias_row + key);
                if (bv * 1.44269504f == STOF_NEG_INF)
                    continue;
                s += bv;
            }
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
    if (p.lse && lane == 0) // natural log of the row's sum of exp(scores)
        p.lse[((stof_i64)b * p.heads + h) * p.seq_q + row] =
            l > 0.0f ? m + logf(l) : STOF_NEG_INF;
#pragma unroll
    for (int i = 0; i < STOF_REF_PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < HEAD_DIM)
            stof_store(o + d, acc[i] * inv);
    }
}

extern "C" __global__ void __launch_bounds__(32 * STOF_REF_WARPS)
stof_attn_reference(const stof_attn_params p)
{
    int rb, bh;
    stof_cta_rb_bh((p.seq_q + STOF_REF_WARPS - 1) / STOF_REF_WARPS, rb, bh);
    const int row = rb * STOF_REF_WARPS + (threadIdx.x >> 5);
    if (row >= p.seq_q)
        return;
    const stof_u64 *bits = p.mask_bits + (stof_i64)row * p.mask_words;
    stof_ref_row(p, bh / p.heads, bh % p.heads, row, 2 * p.mask_words,
                 [&](int w) {
                     return (unsigned)(bits[w >> 1] >> (32 * (w & 1)));
                 });
}

// Keys are scanned in chunks of this many; a chunk the interval analysis
// finds empty is skipped (long rows of banded masks).
#define STOF_REF_CHUNK 1024

// Grid ceil(seq_q / STOF_REF_WARPS) x batch * p.heads CTAs in x
// (stof_cta_rb_bh); P holds the program and the instance data (the
// builder's arrays are not read).
// Rows at or past the sequence's q_len write zeros.
extern "C" __global__ void __launch_bounds__(32 * STOF_REF_WARPS)
stof_attn_reference_family(const stof_attn_params p, const stof_mb_params P)
{
    int rb, bh;
    stof_cta_rb_bh((p.seq_q + STOF_REF_WARPS - 1) / STOF_REF_WARPS, rb, bh);
    const int row = rb * STOF_REF_WARPS + (threadIdx.x >> 5);
    if (row >= p.seq_q)
        return;
    int b = bh / p.heads;
    // Packed (P.n_seq > 0; p.batch is 1): the row's sequence, with its
    // rows and keys at offsets qs / ks of the packed tensors.
    // With head_* leaves the family's sequences are (b, head) pairs (the
    // reference then runs every head: p.heads == P.heads_data).
    const int pb = P.n_seq > 0          ? mb_pk_find(P.pk, P.n_seq, row)
                   : P.heads_data > 1 ? b * P.heads_data + bh % p.heads
                                        : b;
    const mb_seq s = pb >= 0 ? mb_load_seq(P, pb) : mb_seq{};
    const stof_i64 pos = (s.one ? 0 : (stof_i64)row - s.qs) + s.off;
    const int n_words = pb >= 0 && row - s.qs < s.ql
                            ? (s.ks + s.kl + 31) / 32 : 0;
    int chunk = -1, chunk_empty = 0;
    stof_ref_row(p, b, bh % p.heads, row, n_words, [&](int w) -> unsigned {
        const int c = (w * 32) / STOF_REF_CHUNK;
        if (c != chunk) {
            chunk = c;
            // The chunk's keys within the sequence.
            stof_i64 k0 = (stof_i64)c * STOF_REF_CHUNK - s.ks;
            stof_i64 k1 = k0 + STOF_REF_CHUNK - 1;
            k0 = k0 < 0 ? 0 : k0;
            k1 = k1 > s.kl - 1 ? s.kl - 1 : k1;
            chunk_empty = k0 > k1 ||
                          mb_classify(P, pos, pos, k0, k1, s) == MB_EMPTY;
        }
        return chunk_empty ? 0u
                           : mb_word(P, pos, (stof_i64)w * 32 - s.ks, s);
    });
}

// x[i] for i < n: uniform in [-amp, amp] from (seed, i), rounded to DTYPE.
extern "C" __global__ void __launch_bounds__(256)
stof_ref_fill(unsigned short *x, stof_i64 n, unsigned long long seed,
              float amp)
{
    for (stof_i64 i = (stof_i64)blockIdx.x * 256 + threadIdx.x; i < n;
         i += (stof_i64)gridDim.x * 256) {
        unsigned long long z = seed + (unsigned long long)i *
                                          0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float f =
            ((float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * amp;
        stof_store(x + i, f);
    }
}

// Over heads 0 .. p.heads - 1 of every batch element and every row:
// acc[0] += sum (o - ref)^2, acc[1] += sum ref^2, acc[2] += the values that
// are not finite in either. p.o is the output, p.q the reference (both with
// o_stride). Grid ceil(seq_q / 8) x batch * p.heads CTAs in x
// (stof_cta_rb_bh), 256 threads.
extern "C" __global__ void __launch_bounds__(256)
stof_ref_diff(const stof_attn_params p, double *acc)
{
    int rb, bh;
    stof_cta_rb_bh((p.seq_q + 7) / 8, rb, bh);
    const int row = rb * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    double e = 0.0, r = 0.0, bad = 0.0;
    if (row < p.seq_q) {
        const int b = bh / p.heads, h = bh % p.heads;
        const stof_i64 off = b * p.o_stride[0] + h * p.o_stride[1] +
                             (stof_i64)row * p.o_stride[2];
        for (int d = lane; d < HEAD_DIM; d += 32) {
            const float g = stof_load(p.o + off + d);
            const float w = stof_load(p.q + off + d);
            if (!isfinite(g) || !isfinite(w)) {
                bad += 1.0;
                continue;
            }
            e += (double)(g - w) * (double)(g - w);
            r += (double)w * (double)w;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        e += __shfl_xor_sync(0xffffffffu, e, o);
        r += __shfl_xor_sync(0xffffffffu, r, o);
        bad += __shfl_xor_sync(0xffffffffu, bad, o);
    }
    if (lane == 0 && row < p.seq_q) {
        atomicAdd(acc, e);
        atomicAdd(acc + 1, r);
        atomicAdd(acc + 2, bad);
    }
}
