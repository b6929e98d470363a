/*
 * test_reference.c - the C reference attention (what every GPU kernel is
 * checked against) against an independent double-precision computation.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"

/* Straightforward double-precision masked attention over dense bytes. */
static void attention_f64(const stof_attention_desc *d, const uint8_t *mask,
                          const float *q, const float *k, const float *v,
                          double *o)
{
    const double scale =
        d->scale != 0.0f ? d->scale : 1.0 / sqrt((double)d->head_dim);
    double *s = malloc(sizeof(double) * d->seq_k);
    for (int b = 0; b < d->batch; b++)
        for (int h = 0; h < d->heads; h++)
            for (int i = 0; i < d->seq_q; i++) {
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j < d->seq_k; j++) {
                    if (!mask[(size_t)i * d->seq_k + j])
                        continue;
                    double acc = 0.0;
                    for (int c = 0; c < d->head_dim; c++)
                        acc += (double)q[b * d->q_stride[0] + h * d->q_stride[1] +
                                         i * d->q_stride[2] + c] *
                               k[b * d->k_stride[0] + h * d->k_stride[1] +
                                 j * d->k_stride[2] + c];
                    s[j] = acc * scale;
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j < d->seq_k; j++)
                    if (mask[(size_t)i * d->seq_k + j])
                        sum += exp(s[j] - mx);
                for (int c = 0; c < d->head_dim; c++) {
                    double acc = 0.0;
                    for (int j = 0; j < d->seq_k; j++)
                        if (mask[(size_t)i * d->seq_k + j])
                            acc += exp(s[j] - mx) / sum *
                                   v[b * d->v_stride[0] + h * d->v_stride[1] +
                                     j * d->v_stride[2] + c];
                    o[b * d->o_stride[0] + h * d->o_stride[1] +
                      i * d->o_stride[2] + c] = sum > 0 ? acc : 0.0;
                }
            }
    free(s);
}

static void check(int batch, int heads, int sq, int sk, int hd, double p,
                  stof_layout layout, float scale, uint64_t salt)
{
    tu_rng r = {tu_seed() ^ salt};
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    uint8_t *bytes = tu_random_dense(&r, sq, sk, p);
    /* Leave some rows with no key at all. */
    for (int i = 0; i < sq; i += 7)
        for (int j = 0; j < sk; j++)
            bytes[(size_t)i * sk + j] = 0;
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_dense(ctx, bytes, sq, sk, &m), STOF_OK);
    stof_attention_desc d;
    stof_attention_desc_init(&d, batch, heads, sq, sk, hd, STOF_DTYPE_FP16,
                             layout);
    d.scale = scale;
    size_t nq = (size_t)batch * heads * sq * hd, nk = (size_t)batch * heads * sk * hd;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4),
          *o = malloc(nq * 4);
    double *o64 = malloc(nq * 8), *of = malloc(nq * 8);
    for (size_t i = 0; i < nq; i++)
        q[i] = (float)(tu_uniform(&r) * 4 - 2), o[i] = NAN;
    for (size_t i = 0; i < nk; i++)
        k[i] = (float)(tu_uniform(&r) * 4 - 2), v[i] = (float)(tu_uniform(&r) * 2 - 1);
    cr_assert_eq(stof__ref_attention(&d, m, q, k, v, o), STOF_OK);
    attention_f64(&d, bytes, q, k, v, o64);
    for (size_t i = 0; i < nq; i++)
        of[i] = o[i];
    double err = tu_rel_err(of, o64, nq);
    cr_assert_lt(err, 1e-5, "%dx%dx%dx%d d=%d p=%.2f: rel err %.3e", batch,
                 heads, sq, sk, hd, p, err);
    /* Rows with no key are exactly zero. */
    for (int b = 0; b < batch; b++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < sq; i += 7)
                for (int c = 0; c < hd; c++)
                    cr_assert_eq(o[b * d.o_stride[0] + h * d.o_stride[1] +
                                   i * d.o_stride[2] + c], 0.0f);
    free(q), free(k), free(v), free(o), free(o64), free(of), free(bytes);
    stof_mask_free(&m);
    stof_close(&ctx);
}

Test(reference, matches_double_precision)
{
    check(1, 1, 33, 65, 16, 0.5, STOF_LAYOUT_BHSD, 0.0f, 1);
    check(2, 3, 100, 37, 64, 0.2, STOF_LAYOUT_BSHD, 0.0f, 2);
    check(1, 2, 64, 200, 40, 0.9, STOF_LAYOUT_BHSD, 0.3f, 3);
    check(1, 1, 257, 129, 128, 0.05, STOF_LAYOUT_BSHD, 0.0f, 4);
}

/* Grouped-query attention: the reference with kv_heads equals the same
 * problem with every K/V head repeated for its query heads. */
Test(reference, grouped_query_heads_read_their_group)
{
    tu_rng r = {tu_seed() ^ 0x6a9};
    const int B = 2, H = 6, KV = 2, S = 37, D = 16;
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "sliding:9|strided:5", S, S, &m),
                 STOF_OK);
    stof_attention_desc g, e;
    stof_attention_desc_init(&g, B, H, S, S, D, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    e = g;
    g.kv_heads = KV;
    /* BHSD with KV heads for k and v. */
    g.k_stride[0] = g.v_stride[0] = (int64_t)KV * S * D;
    const size_t nq = (size_t)B * H * S * D, nk = (size_t)B * KV * S * D;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
    float *ke = malloc(nq * 4), *ve = malloc(nq * 4);
    float *o1 = malloc(nq * 4), *o2 = malloc(nq * 4);
    for (size_t i = 0; i < nq; i++)
        q[i] = (float)tu_uniform(&r) - 0.5f;
    for (size_t i = 0; i < nk; i++) {
        k[i] = (float)tu_uniform(&r) - 0.5f;
        v[i] = (float)tu_uniform(&r) - 0.5f;
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *ks = k + ((size_t)b * KV + h / (H / KV)) * S * D;
            const float *vs = v + ((size_t)b * KV + h / (H / KV)) * S * D;
            memcpy(ke + ((size_t)b * H + h) * S * D, ks, (size_t)S * D * 4);
            memcpy(ve + ((size_t)b * H + h) * S * D, vs, (size_t)S * D * 4);
        }
    cr_assert_eq(stof__ref_attention(&g, m, q, k, v, o1), STOF_OK);
    cr_assert_eq(stof__ref_attention(&e, m, q, ke, ve, o2), STOF_OK);
    cr_assert(memcmp(o1, o2, nq * 4) == 0, "GQA differs from expanded K/V");
    /* And not the same as reading head h of K (a wrong mapping shows). */
    stof_attention_desc w = e;
    w.k_stride[0] = w.v_stride[0] = (int64_t)KV * S * D;
    w.heads = KV;
    float *o3 = malloc((size_t)B * KV * S * D * 4);
    w.q_stride[0] = w.o_stride[0] = (int64_t)KV * S * D;
    cr_assert_eq(stof__ref_attention(&w, m, q, k, v, o3), STOF_OK);
    cr_assert(memcmp(o1 + (size_t)S * D, o3 + (size_t)S * D,
                     (size_t)S * D * 4) != 0,
              "query head 1 read K/V head 1");
    free(q);
    free(k);
    free(v);
    free(ke);
    free(ve);
    free(o1);
    free(o2);
    free(o3);
    stof_mask_free(&m);
    stof_close(&ctx);
}

/* An additive bias masks its key at -inf and at a value that overflows
 * once scaled by log2(e) (bf16's most negative, -3.39e38): a row all such
 * gives zeros, as a row with no key does, not the mean of V; a row with
 * one such key equals that key masked out. */
Test(reference, a_bias_of_bf16_s_most_negative_masks_its_key)
{
    tu_rng r = {tu_seed() ^ 0xb1a5};
    const int S = 5, D = 8;
    const float lowest = -3.38953139e38f;
    cr_assert(stof__bias_masks(lowest) && stof__bias_masks(-INFINITY));
    cr_assert(!stof__bias_masks(-65504.0f) && !stof__bias_masks(-1e30f));
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK);
    stof_mask *dense = NULL, *cut = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "dense", S, S, &dense), STOF_OK);
    uint8_t bits[5 * 5];
    memset(bits, 1, sizeof(bits));
    bits[1 * S + 2] = 0; /* row 1 without key 2 */
    cr_assert_eq(stof_mask_from_dense(ctx, bits, S, S, &cut), STOF_OK);
    stof_attention_desc d;
    stof_attention_desc_init(&d, 1, 1, S, S, D, STOF_DTYPE_BF16,
                             STOF_LAYOUT_BHSD);
    float q[5 * 8], k[5 * 8], v[5 * 8], bias[5 * 8] = {0};
    for (int i = 0; i < S * D; i++) {
        q[i] = (float)tu_uniform(&r) - 0.5f;
        k[i] = (float)tu_uniform(&r) - 0.5f;
        v[i] = (float)tu_uniform(&r) + 0.5f; /* a mean of V is not zero */
    }
    d.bias = 1;
    d.bias_stride[2] = 8;
    for (int j = 0; j < S; j++)
        bias[0 * 8 + j] = lowest;
    bias[1 * 8 + 2] = lowest;
    float o[5 * 8], o_cut[5 * 8];
    cr_assert_eq(stof__ref_attention_bias(&d, dense, q, k, v, bias, o),
                 STOF_OK);
    for (int c = 0; c < D; c++)
        cr_assert_eq(o[c], 0.0f, "row 0 column %d: %g, not 0", c,
                     (double)o[c]);
    stof_attention_desc plain = d;
    plain.bias = 0;
    memset(plain.bias_stride, 0, sizeof(plain.bias_stride));
    cr_assert_eq(stof__ref_attention(&plain, cut, q, k, v, o_cut), STOF_OK);
    for (int c = 0; c < D; c++)
        cr_assert_float_eq(o[D + c], o_cut[D + c], 1e-6,
                           "row 1 column %d: %g, masked %g", c,
                           (double)o[D + c], (double)o_cut[D + c]);
    stof_mask_free(&dense);
    stof_mask_free(&cut);
    stof_close(&ctx);
}

Test(reference, detects_a_wrong_answer)
{
    /* The comparison used by every GPU test must notice a small error. */
    double a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4.1};
    cr_assert_gt(tu_rel_err(a, b, 4), 1e-2);
    double n[2] = {NAN, 1};
    cr_assert(isinf(tu_rel_err(n, b, 2)));
    cr_assert(isinf(tu_rel_err(b, n, 2)));
}

Test(reference, rejects_bad_arguments)
{
    stof_attention_desc d;
    stof_attention_desc_init(&d, 1, 1, 4, 4, 16, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    float x[64];
    cr_assert_eq(stof__ref_attention(&d, NULL, x, x, x, x),
                 STOF_ERR_INVALID_ARGUMENT);
}

/* The library's fp16/bf16 conversions (used by the programs and the search
 * backend to make inputs and read outputs) agree with the tests' own,
 * independently written ones, on random values of every magnitude and on
 * the special cases. */
Test(reference, half_conversions_agree_with_the_tests)
{
    tu_rng r = {tu_seed() ^ 77};
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)tu_next(&r);
        float f;
        memcpy(&f, &bits, 4);
        if (isnan(f))
            continue;
        cr_assert_eq(stof__f32_to_half(f, STOF_DTYPE_FP16), tu_f32_to_f16(f),
                     "fp16 of %a", (double)f);
        cr_assert_eq(stof__f32_to_half(f, STOF_DTYPE_BF16), tu_f32_to_bf16(f),
                     "bf16 of %a", (double)f);
    }
    for (uint32_t h = 0; h < 65536; h++) {
        float a = stof__half_to_f32((uint16_t)h, STOF_DTYPE_FP16),
              b = tu_f16_to_f32((uint16_t)h);
        cr_assert(memcmp(&a, &b, 4) == 0 || (isnan(a) && isnan(b)),
                  "fp16 0x%04x", h);
        a = stof__half_to_f32((uint16_t)h, STOF_DTYPE_BF16);
        b = tu_bf16_to_f32((uint16_t)h);
        cr_assert(memcmp(&a, &b, 4) == 0 || (isnan(a) && isnan(b)),
                  "bf16 0x%04x", h);
    }
    cr_assert(isnan(stof__half_to_f32(stof__f32_to_half(NAN, STOF_DTYPE_FP16),
                                      STOF_DTYPE_FP16)));
    cr_assert(isnan(stof__half_to_f32(stof__f32_to_half(NAN, STOF_DTYPE_BF16),
                                      STOF_DTYPE_BF16)));
}
