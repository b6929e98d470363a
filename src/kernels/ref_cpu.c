/*
 * ref_cpu.c - the C reference for masked attention, used by the tests to
 * check every GPU kernel. Plain loops, fp32 arithmetic, a two-pass softmax
 * (max, then sum) over exactly the allowed keys; rows with no allowed key
 * give zeros, as the kernels do. Score modifiers: the soft-cap (tanh in
 * double) and ALiBi's slope * (key - row) from the descriptor, and the
 * additive bias tensor (-inf elements mask their keys).
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>

stof_status stof__ref_attention(const stof_attention_desc *d,
                                const stof_mask *m, const float *q,
                                const float *k, const float *v, float *o)
{
    return stof__ref_attention_bias(d, m, q, k, v, NULL, o);
}

stof_status stof__ref_attention_bias(const stof_attention_desc *d,
                                     const stof_mask *m, const float *q,
                                     const float *k, const float *v,
                                     const float *bias, float *o)
{
    if (!d || !m || !q || !k || !v || !o || d->seq_q != m->seq_q ||
        d->seq_k != m->seq_k || !d->bias != !bias)
        return STOF_ERR_INVALID_ARGUMENT;
    const int D = d->head_dim;
    const float scale =
        d->scale != 0.0f ? d->scale : 1.0f / sqrtf((float)D);
    float *s = malloc(sizeof(float) * (size_t)d->seq_k);
    int32_t *keys = malloc(sizeof(int32_t) * (size_t)d->seq_k);
    if (!s || !keys) {
        free(s);
        free(keys);
        return STOF_ERR_OUT_OF_MEMORY;
    }
    /* Grouped-query attention: query head h reads K/V head h / group. */
    const int group = d->kv_heads > 0 ? d->heads / d->kv_heads : 1;
    for (int b = 0; b < d->batch; b++) {
        for (int h = 0; h < d->heads; h++) {
            const float *qb = q + b * d->q_stride[0] + h * d->q_stride[1];
            const float *kb = k + b * d->k_stride[0] + (h / group) * d->k_stride[1];
            const float *vb = v + b * d->v_stride[0] + (h / group) * d->v_stride[1];
            float *ob = o + b * d->o_stride[0] + h * d->o_stride[1];
            for (int i = 0; i < d->seq_q; i++) {
                const float *qr = qb + (int64_t)i * d->q_stride[2];
                float *orow = ob + (int64_t)i * d->o_stride[2];
                const float *brow =
                    bias ? bias + b * d->bias_stride[0] +
                               h * d->bias_stride[1] +
                               (int64_t)i * d->bias_stride[2]
                         : NULL;
                const uint64_t *bits = m->bits + (size_t)i * m->words_per_row;
                int n = 0;
                float mx = -INFINITY;
                for (int j = 0; j < d->seq_k; j++) {
                    if (!((bits[j >> 6] >> (j & 63)) & 1u))
                        continue;
                    const float *kr = kb + (int64_t)j * d->k_stride[2];
                    float acc = 0.0f;
                    for (int c = 0; c < D; c++)
                        acc += qr[c] * kr[c];
                    acc *= scale;
                    if (d->softcap > 0.0f)
                        acc = (float)(d->softcap *
                                      tanh((double)acc / d->softcap));
                    if (d->alibi_slopes)
                        acc += d->alibi_slopes[h] * (float)(j - i);
                    if (brow) {
                        if (stof__bias_masks(brow[j]))
                            continue;
                        acc += brow[j];
                    }
                    keys[n] = j;
                    s[n++] = acc;
                    if (acc > mx)
                        mx = acc;
                }
                for (int c = 0; c < D; c++)
                    orow[c] = 0.0f;
                if (n == 0)
                    continue;
                float sum = 0.0f;
                for (int t = 0; t < n; t++) {
                    s[t] = expf(s[t] - mx);
                    sum += s[t];
                }
                for (int t = 0; t < n; t++) {
                    const float *vr = vb + (int64_t)keys[t] * d->v_stride[2];
                    const float pr = s[t] / sum;
                    for (int c = 0; c < D; c++)
                        orow[c] += pr * vr[c];
                }
            }
        }
    }
    free(s);
    free(keys);
    return STOF_OK;
}
