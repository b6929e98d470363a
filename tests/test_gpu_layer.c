/*
 * test_gpu_layer.c - whole Transformer layers (stof_layer_plan / run /
 * stack_run) against a reference composition of unfused operations in C:
 * GEMM + bias (+ activation) (+ residual), the masked attention, the norm,
 * each rounded to the dtype as separate kernels would store it. Post- and
 * pre-norm, LayerNorm and RMSNorm, every activation, fp16 and bf16, tuned
 * and cache-only (cost model) plans, CUDA-graph stacks, database hits.
 * Skips with a message when no GPU is usable.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blaslt.h"
#include "cuda_shim.h"
#include "gemm.h"
#include "internal.h"
#include "layer_int.h"
#include "testutil.h"

static stof_context *open_ctx(const char *user_db, stof_tuning_mode mode)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = user_db;
    s.tuning_mode = mode;
    s.tuning_reps = 5;
    return tu_open_gpu_or_skip(&s);
}

/* Host and device copies of one layer's weights. */
typedef struct lw {
    float *f[12];    /* floats (the dtype's values) */
    size_t n[12];
    CUdeviceptr d[12];
} lw;

enum { W_QKV, B_QKV, W_O, B_O, W_1, B_1, W_2, B_2, G_1, BE_1, G_2, BE_2 };

static CUdeviceptr upload(tu_rng *r, stof_dtype dt, size_t n, float amp,
                          float offset, float **host)
{
    uint16_t *raw = malloc(n * 2);
    float *f = malloc(n * sizeof(float));
    cr_assert(raw && f);
    tu_fill_random(r, raw, f, n, dt, amp);
    if (offset != 0.0f)
        for (size_t i = 0; i < n; i++) {
            f[i] = stof__half_to_f32(stof__f32_to_half(f[i] + offset, dt), dt);
            raw[i] = stof__f32_to_half(f[i], dt);
        }
    CUdeviceptr p = 0;
    const stof_api *api = stof__api();
    cr_assert_eq(api->cuMemAlloc(&p, n * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemcpyHtoD(p, raw, n * 2), CUDA_SUCCESS);
    free(raw);
    *host = f;
    return p;
}

/* A head's size, the attention's width (heads of them: hidden unless
 * desc.head_dim says otherwise) and the QKV projection's columns, qd + 2
 * kv_heads head_dim. */
static int head_size(const stof_layer_desc *d)
{
    return d->head_dim > 0 ? d->head_dim : d->hidden / d->heads;
}

static int att_width(const stof_layer_desc *d)
{
    return d->heads * head_size(d);
}

static int qkv_cols(const stof_layer_desc *d)
{
    const int kvh = d->kv_heads > 0 ? d->kv_heads : d->heads;
    return att_width(d) + 2 * kvh * head_size(d);
}

static void make_weights(tu_rng *r, const stof_layer_desc *d, lw *w)
{
    const size_t h = (size_t)d->hidden, f = (size_t)d->ffn,
                 qn = (size_t)qkv_cols(d),
                 f1 = d->gated ? 2 * f : f; /* gate and up rows */
    const size_t hd = (size_t)head_size(d), qd = (size_t)att_width(d),
                 qk = d->qk_norm ? 2 * hd : 0; /* the QK norm's weights */
    const size_t n[12] = {qn * h + qk, qn, h * qd, h, f1 * h, f1, h * f, h,
                          h, h, h, h};
    for (int i = 0; i < 12; i++) {
        const int is_w = i == W_QKV || i == W_O || i == W_1 || i == W_2;
        const int is_g = i == G_1 || i == G_2;
        const float amp = is_w ? (i == W_2   ? 1.7f / sqrtf((float)f)
                                  : i == W_O ? 1.7f / sqrtf((float)qd)
                                             : 1.7f / sqrtf((float)h))
                               : is_g ? 0.2f : 0.2f;
        w->n[i] = n[i];
        w->d[i] = upload(r, d->dtype, n[i], amp, is_g ? 1.0f : 0.0f, &w->f[i]);
    }
    if (qk) { /* the QK norm's weights after w_qkv's rows: near 1 */
        uint16_t raw[512];
        float *g = w->f[W_QKV] + qn * h;
        for (size_t j = 0; j < qk; j++) {
            raw[j] = stof__f32_to_half(
                1.0f + 0.5f * (float)(tu_uniform(r) - 0.5), d->dtype);
            g[j] = stof__half_to_f32(raw[j], d->dtype);
        }
        cr_assert_eq(stof__api()->cuMemcpyHtoD(w->d[W_QKV] + qn * h * 2, raw,
                                               qk * 2),
                     CUDA_SUCCESS);
    }
}

static void free_weights(lw *w)
{
    for (int i = 0; i < 12; i++) {
        stof__api()->cuMemFree(w->d[i]);
        free(w->f[i]);
    }
}

static stof_layer_weights as_weights(const lw *w, const stof_layer_desc *d)
{
    stof_layer_weights x;
#define P(i) ((const void *)(uintptr_t)w->d[i])
    x.w_qkv = P(W_QKV);
    x.b_qkv = P(B_QKV);
    x.w_o = P(W_O);
    x.b_o = P(B_O);
    x.w_ffn1 = P(W_1);
    x.b_ffn1 = P(B_1);
    x.w_ffn2 = P(W_2);
    x.b_ffn2 = P(B_2);
    x.norm1_gamma = P(G_1);
    x.norm1_beta = d->norm == STOF_NORM_LAYER ? P(BE_1) : NULL;
    x.norm2_gamma = P(G_2);
    x.norm2_beta = d->norm == STOF_NORM_LAYER ? P(BE_2) : NULL;
    if (d->no_bias)
        x.b_qkv = x.b_o = x.b_ffn1 = x.b_ffn2 = NULL;
#undef P
    return x;
}

static float rnd(float v, stof_dtype dt)
{
    return stof__half_to_f32(stof__f32_to_half(v, dt), dt);
}

/* The reference composition: one layer, x -> y ([M][h] floats). */
static void ref_layer(const stof_layer_desc *d, const stof_mask *m,
                      const lw *w, const float *x, float *y)
{
    const int M = d->batch * d->seq, h = d->hidden, f = d->ffn,
              hd = head_size(d), qd = att_width(d), qn = qkv_cols(d),
              kvh = d->kv_heads > 0 ? d->kv_heads : d->heads;
    const stof_dtype dt = d->dtype;
    const float eps = d->norm_eps > 0 ? d->norm_eps : 1e-5f;
    float *n1 = malloc(sizeof(float) * (size_t)M * h);
    float *qkv = malloc(sizeof(float) * (size_t)M * qn);
    float *att = malloc(sizeof(float) * (size_t)M * qd);
    float *hbuf = malloc(sizeof(float) * (size_t)M * h);
    float *n2 = malloc(sizeof(float) * (size_t)M * h);
    float *fb = malloc(sizeof(float) * (size_t)M * f);
    float *q = malloc(sizeof(float) * (size_t)M * qd);
    float *k = malloc(sizeof(float) * (size_t)M * qd);
    float *v = malloc(sizeof(float) * (size_t)M * qd);
    float *o = malloc(sizeof(float) * (size_t)M * qd);
    float *row = malloc(sizeof(float) * (size_t)h);
    cr_assert(n1 && qkv && att && hbuf && n2 && fb && q && k && v && o && row);
    const float *g1 = w->f[G_1], *g2 = w->f[G_2];
    const float *be1 = d->norm == STOF_NORM_LAYER ? w->f[BE_1] : NULL;
    const float *be2 = d->norm == STOF_NORM_LAYER ? w->f[BE_2] : NULL;
    /* Without biases (desc.no_bias) the GEMMs add none. */
    const int wb = !d->no_bias;
    const stof_gemm_epi e_bias = {.bias = wb};
    const stof_gemm_epi e_res = {.bias = wb, .residual = 1};
    const stof_gemm_epi e_act = {.bias = wb, .act = (int)d->act,
                                 .gated = d->gated};
    const float *bqkv = wb ? w->f[B_QKV] : NULL, *bo = wb ? w->f[B_O] : NULL,
                *b1 = wb ? w->f[B_1] : NULL, *b2 = wb ? w->f[B_2] : NULL;
    /* norm1 (pre-norm) */
    const float *in = x;
    if (d->pre_norm) {
        for (int r = 0; r < M; r++) {
            stof__ref_norm_row(x + (size_t)r * h, g1, be1, h, (int)d->norm, eps,
                               n1 + (size_t)r * h);
            for (int i = 0; i < h; i++)
                n1[(size_t)r * h + i] = rnd(n1[(size_t)r * h + i], dt);
        }
        in = n1;
    }
    /* The QKV projection; with RoPE, Q's and K's heads (the columns
     * below hidden + kvd) rotated by their positions in their sequences
     * (row % seq) after the bias, before the rounding (stof_layer_desc). */
    const int rope = d->rope_theta == 0.0f && !d->rope_freq ? 0
                     : d->rope_dim > 0                      ? d->rope_dim
                                                            : hd;
    stof_gemm_epi e_qkv = e_bias;
    float *tab = NULL;
    int *pos = NULL;
    if (d->qk_norm) /* (each head normalised first, rotated or not) */
        e_qkv.rope_hd = hd;
    if (rope) {
        e_qkv.rope = rope;
        e_qkv.rope_hd = hd;
        tab = malloc(sizeof(float) * (size_t)d->seq * (size_t)rope);
        pos = malloc(sizeof(int) * (size_t)M);
        cr_assert(tab && pos);
        if (d->rope_freq) /* (the given frequencies and scale) */
            stof__rope_table_f(tab, NULL, d->seq, rope, d->rope_freq,
                               d->rope_scale > 0.0f ? d->rope_scale : 1.0f);
        else
            stof__rope_table(tab, NULL, d->seq, rope, d->rope_theta);
        for (int r = 0; r < M; r++)
            pos[r] = r % d->seq;
    }
    /* (a QK norm: its weights after w_qkv's rows) */
    const stof_ref_rope rp = {tab,
                              pos,
                              qd + kvh * hd,
                              d->qk_norm ? w->f[W_QKV] + (size_t)qn * h
                                         : NULL,
                              qd,
                              eps};
    stof__ref_gemm_rope(in, w->f[W_QKV], bqkv, NULL, NULL, NULL, M, qn, h, h,
                        h, qn, &e_qkv, eps, dt,
                        rope || d->qk_norm ? &rp : NULL, qkv, NULL);
    free(tab);
    free(pos);
    /* attention, BHSD copies: Q's heads, then K's and V's kv_heads heads */
    for (int b = 0; b < d->batch; b++)
        for (int s = 0; s < d->seq; s++)
            for (int hh = 0; hh < d->heads; hh++)
                for (int j = 0; j < hd; j++) {
                    const size_t src = ((size_t)b * d->seq + s) * qn +
                                       (size_t)hh * hd + j;
                    const size_t dst =
                        (((size_t)b * d->heads + hh) * d->seq + s) * hd + j;
                    q[dst] = qkv[src];
                    if (hh >= kvh)
                        continue;
                    const size_t kdst =
                        (((size_t)b * kvh + hh) * d->seq + s) * hd + j;
                    k[kdst] = qkv[src + qd];
                    v[kdst] = qkv[src + qd + (size_t)kvh * hd];
                }
    stof_attention_desc ad;
    stof_attention_desc_init(&ad, d->batch, d->heads, d->seq, d->seq, hd, dt,
                             STOF_LAYOUT_BHSD);
    ad.kv_heads = kvh; /* K and V: kv_heads heads of BHSD */
    for (int t = 0; t < 2; t++) {
        int64_t *st = t ? ad.v_stride : ad.k_stride;
        st[0] = (int64_t)kvh * d->seq * hd;
    }
    cr_assert_eq(stof__ref_attention(&ad, m, q, k, v, o), STOF_OK);
    for (int b = 0; b < d->batch; b++)
        for (int s = 0; s < d->seq; s++)
            for (int hh = 0; hh < d->heads; hh++)
                for (int j = 0; j < hd; j++)
                    att[((size_t)b * d->seq + s) * qd + (size_t)hh * hd + j] =
                        rnd(o[(((size_t)b * d->heads + hh) * d->seq + s) * hd +
                              j],
                            dt);
    /* output projection + residual, then norm */
    stof__ref_gemm(att, w->f[W_O], bo, x, NULL, NULL, M, h, qd, qd, qd, h,
                   &e_res, eps, dt, hbuf, NULL);
    const float *gA = d->pre_norm ? g2 : g1, *bA = d->pre_norm ? be2 : be1;
    for (int r = 0; r < M; r++) {
        stof__ref_norm_row(hbuf + (size_t)r * h, gA, bA, h, (int)d->norm, eps,
                           n2 + (size_t)r * h);
        for (int i = 0; i < h; i++)
            n2[(size_t)r * h + i] = rnd(n2[(size_t)r * h + i], dt);
    }
    /* post-norm: H = n2; pre-norm: residual stream hbuf, FFN input n2 */
    const float *ffn_in = n2;
    const float *res2 = d->pre_norm ? hbuf : n2;
    stof__ref_gemm(ffn_in, w->f[W_1], b1, NULL, NULL, NULL, M, f, h, h,
                   h, f, &e_act, eps, dt, fb, NULL);
    stof__ref_gemm(fb, w->f[W_2], b2, res2, NULL, NULL, M, h, f, f, f,
                   h, &e_res, eps, dt, y, NULL);
    if (!d->pre_norm)
        for (int r = 0; r < M; r++) {
            memcpy(row, y + (size_t)r * h, sizeof(float) * (size_t)h);
            stof__ref_norm_row(row, g2, be2, h, (int)d->norm, eps,
                               y + (size_t)r * h);
            for (int i = 0; i < h; i++)
                y[(size_t)r * h + i] = rnd(y[(size_t)r * h + i], dt);
        }
    free(n1);
    free(qkv);
    free(att);
    free(hbuf);
    free(n2);
    free(fb);
    free(q);
    free(k);
    free(v);
    free(o);
    free(row);
}

static double rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void download(CUdeviceptr p, size_t n, stof_dtype dt, float *out)
{
    uint16_t *raw = malloc(n * 2);
    cr_assert(raw);
    cr_assert_eq(stof__api()->cuMemcpyDtoH(raw, p, n * 2), CUDA_SUCCESS);
    for (size_t i = 0; i < n; i++)
        out[i] = stof__half_to_f32(raw[i], dt);
    free(raw);
}

/* A layer's description and key name its RoPE: the description's "rope"
 * is {"theta": the base, "dim": the rotated channels of a head, "scale",
 * "freq": "theta"} (null without; with frequencies of its own "theta"
 * null and "freq" "table"), the key text ends in ";rope=THETA;rope_dim=D"
 * (";rope=table;rope_dim=D" with its own; nothing without), and the QKV
 * step says where the rotation runs: "fused" in
 * the epilogue of a Hopper tile that holds whole heads (block_n a
 * multiple of head_dim: heads of 96 fuse only in 192-wide tiles),
 * "kernel" after cuBLASLt, the mma.sync template or a Hopper tile that
 * splits heads (heads of 80). Returns 1 when the rope kernel runs, else
 * 0. */
static int expect_rope_desc(const stof_layer *L, const stof_layer_desc *d,
                            const char *desc)
{
    const int hd = head_size(d);
    if (d->qk_norm) {
        /* The qk kernel after the plain product normalises and rotates:
         * the QKV step says so, and has no "rope" of its own. */
        const char *q = strstr(desc, "\"op\":\"qkv\"");
        cr_assert(q, "%s", desc);
        const char *next = strstr(q + 5, "\"op\":");
        const char *k = strstr(q, "\"qk_norm\":\"kernel\"");
        const char *r = strstr(q, "\"rope\":\"");
        cr_expect(k && (!next || k < next), "no qk kernel: %s", desc);
        cr_expect(!r || (next && r > next), "a QKV rope with qk_norm: %s",
                  desc);
        cr_expect(strstr(desc, "\"qk_norm\":true") != NULL, "%s", desc);
        cr_expect(strstr(L->key_text, ";qk_norm=1") != NULL, "%s",
                  L->key_text);
        return 1;
    }
    if (d->rope_theta == 0.0f && !d->rope_freq) {
        cr_expect(strstr(desc, "\"rope\":null") != NULL, "%s", desc);
        cr_expect(strstr(L->key_text, "rope") == NULL, "%s", L->key_text);
        cr_expect(strstr(desc, "\"rope\":\"") == NULL, "%s", desc);
        return 0;
    }
    char want[96];
    if (d->rope_freq)
        snprintf(want, sizeof(want), ";rope=table;rope_dim=%d", d->rope_dim);
    else
        snprintf(want, sizeof(want), ";rope=%a;rope_dim=%d",
                 (double)d->rope_theta, d->rope_dim);
    cr_expect(strstr(L->key_text, want) != NULL, "key %s, not %s",
              L->key_text, want);
    const char *r = strstr(desc, "\"rope\":{");
    cr_assert(r, "%s", desc);
    double theta = 0.0, scale = 0.0;
    int dim = 0;
    char freq[8] = "";
    if (d->rope_freq) {
        cr_expect_eq(sscanf(r,
                            "\"rope\":{\"theta\":null,\"dim\":%d,"
                            "\"scale\":%lf,\"freq\":\"%5[a-z]\"}",
                            &dim, &scale, freq),
                     3, "%.80s", r);
        cr_expect_str_eq(freq, "table", "%.80s", r);
    } else {
        cr_expect_eq(sscanf(r,
                            "\"rope\":{\"theta\":%lf,\"dim\":%d,"
                            "\"scale\":%lf,\"freq\":\"%5[a-z]\"}",
                            &theta, &dim, &scale, freq),
                     4, "%.80s", r);
        cr_expect_eq((float)theta, d->rope_theta, "%.80s", r);
        cr_expect_str_eq(freq, "theta", "%.80s", r);
    }
    cr_expect_eq((float)scale, d->rope_scale > 0.0f ? d->rope_scale : 1.0f,
                 "%.80s", r);
    cr_expect_eq(dim, d->rope_dim > 0 ? d->rope_dim : hd, "%.80s", r);
    /* The QKV step: up to the next step's "op". */
    const char *q = strstr(desc, "\"op\":\"qkv\"");
    cr_assert(q, "%s", desc);
    const char *next = strstr(q + 5, "\"op\":");
    const char *fused = strstr(q, "\"rope\":\"fused\""),
               *kern = strstr(q, "\"rope\":\"kernel\""),
               *wg = strstr(q, "\"wg\":1"), *bn_at = strstr(q, "\"bn\":");
    if (next) {
        fused = fused && fused < next ? fused : NULL;
        kern = kern && kern < next ? kern : NULL;
        wg = wg && wg < next ? wg : NULL;
        bn_at = bn_at && bn_at < next ? bn_at : NULL;
    }
    static const char lt[] = "\"op\":\"qkv\",\"kernel\":\"cublaslt\"";
    const int is_lt = strncmp(q, lt, sizeof(lt) - 1) == 0;
    int bn = 0; /* the template's tile width (none for cuBLASLt) */
    if (!is_lt && (!bn_at || sscanf(bn_at, "\"bn\":%d", &bn) != 1))
        bn = 0;
    cr_expect(is_lt || bn > 0, "the QKV step has no tile width: %s", desc);
    cr_expect((fused != NULL) + (kern != NULL) == 1,
              "the QKV step has no \"rope\" (or two): %s", desc);
    /* The Hopper template fuses it in tiles of whole heads, rotating a
     * multiple of 16 channels; cuBLASLt, mma.sync, Hopper tiles that split
     * heads and other rotations (24 channels) cannot. */
    const int rope = d->rope_dim > 0 ? d->rope_dim : hd;
    const int whole = bn > 0 && bn % hd == 0 && rope % 16 == 0;
    cr_expect_eq(fused != NULL, !is_lt && wg != NULL && whole,
                 "rope %s on %s (block_n %d, heads of %d): %s",
                 fused ? "fused" : "kernel",
                 is_lt ? "cublaslt" : wg ? "wgmma" : "mma.sync", bn, hd,
                 desc);
    cr_log_info("rope %s on %s (block_n %d, heads of %d)",
                fused ? "fused" : "kernel",
                is_lt ? "cublaslt" : wg ? "wgmma" : "mma.sync", bn, hd);
    return kern != NULL;
}

typedef struct lcase {
    stof_dtype dt;
    int pre;
    stof_norm_kind norm;
    stof_activation act;
    stof_tuning_mode mode;
    int in_place;
    int heads, kv_heads; /* 0, 0: 2 heads of 64 (hidden 128), no grouping */
    int no_bias;
    int gated;
    float rope_theta; /* RoPE: 0 none */
    int rope_dim;     /* (0: the whole head) */
    const float *rope_freq; /* RoPE with its own frequencies (theta 0) */
    float rope_scale; /* (0: 1) */
    int qk_norm;      /* Q and K normalised per head (then rotated) */
    int hd;           /* head_dim (0: 64) */
    int rope_split;   /* 1: the QKV GEMM must run split (the rope kernel) */
    int batch, seq;   /* 0, 0: 2 sequences of 128 */
    const char *mask; /* NULL: bigbird:32:1:1:1:3 */
    int hidden;       /* 0: heads * hd; else hidden, with head_dim hd */
} lcase;

static void run_case(const lcase *c)
{
    stof_context *ctx = open_ctx("", c->mode);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    stof_layer_desc d;
    const int heads = c->heads > 0 ? c->heads : 2, hd = c->hd > 0 ? c->hd : 64;
    const int batch = c->batch > 0 ? c->batch : 2,
              seq = c->seq > 0 ? c->seq : 128;
    stof_layer_desc_init(&d, batch, seq, c->hidden > 0 ? c->hidden : hd * heads,
                         heads, c->dt);
    if (c->hidden > 0)
        d.head_dim = hd;
    d.kv_heads = c->kv_heads;
    d.no_bias = c->no_bias;
    d.gated = c->gated;
    d.rope_theta = c->rope_theta;
    d.rope_dim = c->rope_dim;
    d.rope_freq = c->rope_freq;
    d.rope_scale = c->rope_scale;
    d.qk_norm = c->qk_norm;
    d.ffn = 256;
    d.pre_norm = c->pre;
    d.norm = c->norm;
    d.act = c->act;
    stof_mask *m =
        tu_make_mask(ctx, c->mask ? c->mask : "bigbird:32:1:1:1:3", seq, seq);
    tu_rng r = {tu_seed() ^ 0x1a7e7u};
    lw w;
    make_weights(&r, &d, &w);
    const size_t n = (size_t)d.batch * d.seq * d.hidden;
    float *xf = NULL, *yf = malloc(n * sizeof(float)),
          *ref = malloc(n * sizeof(float));
    cr_assert(yf && ref);
    CUdeviceptr x = upload(&r, c->dt, n, 1.0f, 0.0f, &xf);
    CUdeviceptr y = x;
    if (!c->in_place)
        cr_assert_eq(stof__api()->cuMemAlloc(&y, n * 2), CUDA_SUCCESS);
    stof_layer *L = NULL;
    stof_status st = stof_layer_plan(ctx, &d, m, &L);
    cr_assert_eq(st, STOF_OK, "stof_layer_plan: %s", stof_errmsg(ctx));
    char desc[16384];
    size_t need = 0;
    cr_assert_eq(stof_layer_describe(L, desc, sizeof(desc), &need), STOF_OK);
    cr_log_info("layer: %s", desc);
    /* cuBLASLt's workspace: what the chosen kernels need, none without
     * one. */
    const char *dev_bytes = strstr(desc, "\"device_bytes\":");
    cr_assert(dev_bytes, "%s", desc);
    const char *q = strstr(dev_bytes, "\"cublaslt\":");
    long long lt_bytes = -1;
    cr_assert(q && sscanf(q + strlen("\"cublaslt\":"), "%lld", &lt_bytes) == 1,
              "%s", desc);
    cr_assert_eq(lt_bytes, (long long)((stof__layer_lt_need(L) + 255) /
                                       256 * 256),
                 "cuBLASLt's workspace %lld bytes, its kernels need %zu",
                 lt_bytes, stof__layer_lt_need(L));
    cr_assert(lt_bytes <= (long long)STOF_BLASLT_WORKSPACE, "%lld", lt_bytes);
    if (!strstr(desc, "\"kernel\":\"cublaslt\""))
        cr_assert_eq(lt_bytes, 0,
                     "no cuBLASLt kernel, yet %lld bytes of its workspace",
                     lt_bytes);
    const int split = expect_rope_desc(L, &d, desc);
    {
        char want[48];
        snprintf(want, sizeof(want), "\"head_dim\":%d", hd);
        cr_expect(strstr(desc, want) != NULL, "%s", desc);
        snprintf(want, sizeof(want), ";head_dim=%d", hd);
        cr_expect((strstr(L->key_text, want) != NULL) ==
                      (heads * hd != d.hidden),
                  "key %s", L->key_text);
    }
    if (c->rope_split)
        cr_expect(split, "no Hopper tile holds whole heads of %d: the rope "
                         "kernel should run (%s)",
                  hd, desc);
    const stof_layer_weights lwt = as_weights(&w, &d);
    ref_layer(&d, m, &w, xf, ref);
    if (c->no_bias) { /* a bias given to a layer planned without is refused */
        stof_layer_weights wb = lwt;
        wb.b_o = (const void *)(uintptr_t)w.d[B_O];
        cr_assert_eq(stof_layer_run(L, &wb, (void *)(uintptr_t)x,
                                    (void *)(uintptr_t)y, NULL),
                     STOF_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(stof_layer_errmsg(L), "no_bias"), "%s",
                  stof_layer_errmsg(L));
    }
    if (!c->in_place) /* (NaN in both dtypes: an unwritten element fails) */
        cr_assert_eq(stof__api()->cuMemsetD8(y, 0xff, n * 2), CUDA_SUCCESS);
    st = stof_layer_run(L, &lwt, (void *)(uintptr_t)x, (void *)(uintptr_t)y,
                        NULL);
    cr_assert_eq(st, STOF_OK, "stof_layer_run: %s", stof_layer_errmsg(L));
    cr_assert_eq(stof__api()->cuCtxSynchronize(), CUDA_SUCCESS);
    download(y, n, c->dt, yf);
    const double e = rel(yf, ref, n);
    const double tol = c->dt == STOF_DTYPE_FP16 ? 1.5e-2 : 4e-2;
    cr_log_info("%d x %d tokens, dtype %d pre %d norm %d act %d mode %d "
                "heads %d/%d of %d gated %d rope %g%s/%d scale %g (%s): "
                "relative error %.3g",
                batch, seq, (int)c->dt, c->pre, (int)c->norm, (int)c->act,
                (int)c->mode, heads, c->kv_heads, hd, c->gated,
                (double)c->rope_theta, c->rope_freq ? " (table)" : "",
                c->rope_dim, (double)c->rope_scale,
                !c->rope_theta && !c->rope_freq ? "none"
                : split                         ? "kernel"
                                                : "fused",
                e);
    cr_expect(e <= tol, "relative error %.3g > %.3g (%s)", e, tol, desc);
    stof_layer_free(&L);
    cr_assert_null(L);
    if (!c->in_place)
        stof__api()->cuMemFree(y);
    stof__api()->cuMemFree(x);
    free_weights(&w);
    free(xf);
    free(yf);
    free(ref);
    stof_mask_free(&m);
    stof__ctx_pop(ctx);
    stof_close(&ctx);
}

/* Each sequence of a family layer's output yf (of input xf) against the
 * reference layer with that sequence's mask (host instance hd). */
static void expect_family_layer(stof_context *ctx,
                                const stof_mask_family *fam,
                                const stof_layer_desc *d, const lw *w,
                                const float *xf, const float *yf,
                                const stof_mask_data *hd, const char *what,
                                int call)
{
    const size_t per = (size_t)d->seq * d->hidden;
    float *ref = malloc(per * sizeof(float));
    cr_assert(ref);
    stof_layer_desc d1 = *d;
    d1.batch = 1;
    const double tol = d->dtype == STOF_DTYPE_FP16 ? 1.5e-2 : 4e-2;
    for (int b = 0; b < d->batch; b++) {
        stof_mask *m = NULL;
        cr_assert_eq(stof_mask_family_eval(ctx, fam, d->seq, d->seq, hd, b,
                                           &m),
                     STOF_OK, "%s", stof_errmsg(ctx));
        ref_layer(&d1, m, w, xf + b * per, ref);
        const double e = rel(yf + b * per, ref, per);
        const int len = hd->q_len ? hd->q_len[b] : d->seq;
        cr_log_info("%s call %d sequence %d (length %d): rel err %.3g", what,
                    call, b, len, e);
        cr_expect(e <= tol, "%s call %d sequence %d (length %d): relative "
                            "error %.3g > %.3g",
                  what, call, b, len, e, tol);
        stof_mask_free(&m);
    }
    free(ref);
}

/* A family layer (BERT with padding: "dense" plus per-sequence lengths, and
 * causal within documents): one plan, runs with new instance data each
 * time, every sequence against the reference layer with that sequence's
 * mask (its padding rows included: their attention is zeros on both
 * sides); then a graph stack replayed after new lengths are written into
 * the same device buffers. Nothing is planned or compiled after the plan. */
static void family_layer_case(const char *spec, stof_dtype dt)
{
    stof_context *ctx = open_ctx("", STOF_TUNE_CACHE_ONLY);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    enum { B = 3, S = 160 };
    stof_layer_desc d;
    stof_layer_desc_init(&d, B, S, 128, 2, dt);
    d.ffn = 256;
    d.act = STOF_ACT_GELU_ERF;
    tu_rng r = {tu_seed() ^ 0xfa11u};
    lw w;
    make_weights(&r, &d, &w);
    const size_t per = (size_t)S * d.hidden, n = (size_t)B * per;
    float *xf = NULL, *yf = malloc(n * sizeof(float));
    cr_assert(yf);
    CUdeviceptr x = upload(&r, dt, n, 1.0f, 0.0f, &xf), y = 0, dd = 0;
    const stof_api *api = stof__api();
    cr_assert_eq(api->cuMemAlloc(&y, n * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dd, 4096 + sizeof(int32_t) * B * S),
                 CUDA_SUCCESS);
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, spec, &fam), STOF_OK);
    stof_layer *L = NULL;
    cr_assert_eq(stof_layer_plan_family(ctx, &d, fam, NULL, &L), STOF_OK,
                 "%s", stof_errmsg(ctx));
    const stof_layer_weights lwt = as_weights(&w, &d);
    const long compiles = stof__jit_compile_count();
    int32_t qlen[B], doc[B * S];
    stof_mask_data hd, dv;
    memset(&hd, 0, sizeof(hd));
    memset(&dv, 0, sizeof(dv));
    const int docs = strstr(spec, "docs") != NULL;
    hd.q_len = hd.k_len = qlen;
    hd.doc_id = docs ? doc : NULL;
    dv.q_len = dv.k_len = (const int32_t *)(uintptr_t)dd;
    dv.doc_id = docs ? (const int32_t *)(uintptr_t)(dd + 4096) : NULL;
    for (int it = 0; it < 3; it++) {
        for (int b = 0; b < B; b++) {
            qlen[b] = it == 0 && b == 0 ? S : 1 + (int)tu_below(&r, S);
            int id = 0;
            for (int k = 0; k < S; k++) {
                if (k && tu_below(&r, 40) == 0)
                    id++;
                doc[b * S + k] = id;
            }
        }
        cr_assert_eq(api->cuMemcpyHtoD(dd, qlen, sizeof(qlen)), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemcpyHtoD(dd + 4096, doc, sizeof(doc)),
                     CUDA_SUCCESS);
        cr_assert_eq(api->cuMemsetD8(y, 0xff, n * 2), CUDA_SUCCESS);
        stof_status st =
            it < 2 ? stof_layer_run_family(L, &dv, &lwt, (void *)(uintptr_t)x,
                                           (void *)(uintptr_t)y, NULL)
                   : stof_layer_stack_run_family(L, &dv, 1, &lwt,
                                                 (void *)(uintptr_t)x,
                                                 (void *)(uintptr_t)y, NULL,
                                                 STOF_STACK_GRAPH);
        cr_assert_eq(st, STOF_OK, "%s", stof_layer_errmsg(L));
        if (it == 2) { /* replay with new lengths in the same buffers */
            for (int b = 0; b < B; b++)
                qlen[b] = 1 + (int)tu_below(&r, S);
            cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
            cr_assert_eq(api->cuMemcpyHtoD(dd, qlen, sizeof(qlen)),
                         CUDA_SUCCESS);
            cr_assert_eq(api->cuMemsetD8(y, 0xff, n * 2), CUDA_SUCCESS);
            cr_assert_eq(stof_layer_stack_run_family(
                             L, &dv, 1, &lwt, (void *)(uintptr_t)x,
                             (void *)(uintptr_t)y, NULL, STOF_STACK_GRAPH),
                         STOF_OK, "%s", stof_layer_errmsg(L));
        }
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        download(y, n, dt, yf);
        expect_family_layer(ctx, fam, &d, &w, xf, yf, &hd, spec, it);
    }
    cr_assert_eq(stof__jit_compile_count(), compiles,
                 "a run compiled something");
    stof_layer_free(&L);
    stof_mask_family_free(&fam);
    api->cuMemFree(dd);
    api->cuMemFree(y);
    api->cuMemFree(x);
    free_weights(&w);
    free(xf);
    free(yf);
    stof__ctx_pop(ctx);
    stof_close(&ctx);
}

Test(gpu_layer, family_padding_per_call_fp16)
{
    family_layer_case("dense", STOF_DTYPE_FP16);
}

Test(gpu_layer, family_causal_documents_bf16)
{
    family_layer_case("causal&docs", STOF_DTYPE_BF16);
}

/* A family layer's stack graph records its instance's pointers: a call
 * whose bitmap is in another buffer (or whose bitmap_words differ) records
 * again rather than replaying the first bitmap; each call's output matches
 * the reference layer of its own masks. */
Test(gpu_layer, family_stack_graph_follows_a_new_bitmap)
{
    stof_context *ctx = open_ctx("", STOF_TUNE_CACHE_ONLY);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    enum { B = 2, S = 128, WORDS = S / 32 };
    const stof_dtype dt = STOF_DTYPE_FP16;
    stof_layer_desc d;
    stof_layer_desc_init(&d, B, S, 128, 2, dt);
    d.ffn = 256;
    tu_rng r = {tu_seed() ^ 0xb17aau};
    lw w;
    make_weights(&r, &d, &w);
    const size_t per = (size_t)S * d.hidden, n = (size_t)B * per;
    float *xf = NULL, *yf = malloc(n * sizeof(float));
    cr_assert(yf);
    CUdeviceptr x = upload(&r, dt, n, 1.0f, 0.0f, &xf), y = 0, bm[2] = {0};
    const stof_api *api = stof__api();
    cr_assert_eq(api->cuMemAlloc(&y, n * 2), CUDA_SUCCESS);
    enum { WORDS_ALL = B * S * (WORDS + 1) };
    uint32_t bits[2][WORDS_ALL];
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, "bitmap", &fam), STOF_OK);
    stof_layer *L = NULL;
    cr_assert_eq(stof_layer_plan_family(ctx, &d, fam, NULL, &L), STOF_OK,
                 "%s", stof_errmsg(ctx));
    const stof_layer_weights lwt = as_weights(&w, &d);
    /* call 0: bitmap 0 with WORDS a row; 1: bitmap 1, same shape; 2:
     * bitmap 1 read with WORDS + 1 words a row */
    for (int call = 0; call < 3; call++) {
        const int which = call == 0 ? 0 : 1,
                  words = call == 2 ? WORDS + 1 : WORDS;
        /* new bits each call (call 2 in call 1's buffer) */
        for (int i = 0; i < WORDS_ALL; i++)
            bits[which][i] = (uint32_t)tu_below(&r, 1u << 16) << 16 |
                             (uint32_t)tu_below(&r, 1u << 16);
        if (!bm[which])
            cr_assert_eq(api->cuMemAlloc(&bm[which], sizeof(bits[0])),
                         CUDA_SUCCESS);
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemcpyHtoD(bm[which], bits[which],
                                       sizeof(bits[0])),
                     CUDA_SUCCESS);
        stof_mask_data hd, dv;
        memset(&hd, 0, sizeof(hd));
        hd.bitmap = bits[which];
        hd.bitmap_stride = (int64_t)S * words;
        hd.bitmap_words = words;
        dv = hd;
        dv.bitmap = (const uint32_t *)(uintptr_t)bm[which];
        cr_assert_eq(api->cuMemsetD8(y, 0xff, n * 2), CUDA_SUCCESS);
        cr_assert_eq(stof_layer_stack_run_family(L, &dv, 1, &lwt,
                                                 (void *)(uintptr_t)x,
                                                 (void *)(uintptr_t)y, NULL,
                                                 STOF_STACK_GRAPH),
                     STOF_OK, "%s", stof_layer_errmsg(L));
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        download(y, n, dt, yf);
        expect_family_layer(ctx, fam, &d, &w, xf, yf, &hd, "bitmap", call);
    }
    stof_layer_free(&L);
    stof_mask_family_free(&fam);
    api->cuMemFree(bm[0]);
    api->cuMemFree(bm[1]);
    api->cuMemFree(y);
    api->cuMemFree(x);
    free_weights(&w);
    free(xf);
    free(yf);
    stof__ctx_pop(ctx);
    stof_close(&ctx);
}

Test(gpu_layer, family_run_on_a_mask_layer_is_refused)
{
    stof_context *ctx = open_ctx("", STOF_TUNE_CACHE_ONLY);
    stof_layer_desc d;
    stof_layer_desc_init(&d, 1, 64, 128, 2, STOF_DTYPE_FP16);
    stof_mask *m = tu_make_mask(ctx, "causal", 64, 64);
    stof_layer *L = NULL;
    cr_assert_eq(stof_layer_plan(ctx, &d, m, &L), STOF_OK, "%s",
                 stof_errmsg(ctx));
    stof_layer_weights w;
    memset(&w, 0, sizeof(w));
    cr_assert_eq(stof_layer_run_family(L, NULL, &w, NULL, NULL, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_layer_errmsg(L), "stof_layer_plan_family"), "%s",
              stof_layer_errmsg(L));
    stof_layer_free(&L);
    stof_mask_free(&m);
    stof_close(&ctx);
}

Test(gpu_layer, post_layernorm_gelu_tanh_fp16)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_TANH,
                     .mode = STOF_TUNE_DEFAULT};
    run_case(&c);
}

Test(gpu_layer, pre_layernorm_gelu_erf_bf16)
{
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .pre = 1,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_ERF,
                     .mode = STOF_TUNE_DEFAULT};
    run_case(&c);
}

Test(gpu_layer, post_rmsnorm_relu_bf16_in_place)
{
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_RELU,
                     .mode = STOF_TUNE_DEFAULT,
                     .in_place = 1};
    run_case(&c);
}

Test(gpu_layer, pre_rmsnorm_silu_fp16_cost_model)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_CACHE_ONLY};
    run_case(&c);
}

Test(gpu_layer, post_layernorm_gelu_erf_fp16_cost_model_in_place)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_ERF,
                     .mode = STOF_TUNE_CACHE_ONLY,
                     .in_place = 1};
    run_case(&c);
}

/* Grouped-query layers: 4 query heads on 2 K/V heads (tuned), and
 * multi-query (8 on 1, the cost model's choice). */
Test(gpu_layer, grouped_query_pre_rmsnorm_silu_bf16)
{
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_DEFAULT,
                     .heads = 4,
                     .kv_heads = 2};
    run_case(&c);
}

Test(gpu_layer, multi_query_post_layernorm_gelu_fp16_cost_model)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_TANH,
                     .mode = STOF_TUNE_CACHE_ONLY,
                     .heads = 8,
                     .kv_heads = 1};
    run_case(&c);
}

/* Llama-style: no biases, pre-RMSNorm, SiLU, 4 query heads on 2 (tuned);
 * and post-LayerNorm without biases with the cost model's choice. */
Test(gpu_layer, no_bias_grouped_pre_rmsnorm_silu_bf16)
{
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_DEFAULT,
                     .heads = 4,
                     .kv_heads = 2,
                     .no_bias = 1};
    run_case(&c);
}

Test(gpu_layer, no_bias_post_layernorm_gelu_erf_fp16_cost_model)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_ERF,
                     .mode = STOF_TUNE_CACHE_ONLY,
                     .in_place = 1,
                     .no_bias = 1};
    run_case(&c);
}

/* Gated FFNs: a Llama-style layer (SwiGLU, no biases, pre-RMSNorm, 4
 * query heads on 2; tuned: on Hopper the fused template competes with
 * cuBLASLt's wide product and the gate kernel), and GeGLU with biases,
 * post-LayerNorm, with the cost model's choice (cuBLASLt's first
 * algorithm where it can serve: the split path). */
Test(gpu_layer, gated_swiglu_llama_style_bf16)
{
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_DEFAULT,
                     .heads = 4,
                     .kv_heads = 2,
                     .no_bias = 1,
                     .gated = 1};
    run_case(&c);
}

Test(gpu_layer, gated_geglu_bias_post_layernorm_fp16_cost_model)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_TANH,
                     .mode = STOF_TUNE_CACHE_ONLY,
                     .gated = 1};
    run_case(&c);
}

/* Rotary position embeddings (rotate-half, as Hugging Face computes
 * them), against the reference's QKV projection with the rotation after
 * its bias: a Llama-style layer (SwiGLU, no biases, pre-RMSNorm, 4 query
 * heads of 128 on 2, theta 10000 over whole heads; tuned: on Hopper the
 * fused epilogue competes with the plain GEMMs and the rope kernel, each
 * verified by the search), a post-LayerNorm layer with biases rotating
 * half of each head (GPT-NeoX's partial rotary; tuned), the same with
 * the cost model's choice (cuBLASLt's first algorithm where it can serve:
 * the rope kernel) and Llama 3's base. */
Test(gpu_layer, rope_llama_style_bf16)
{
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_DEFAULT,
                     .heads = 4,
                     .kv_heads = 2,
                     .no_bias = 1,
                     .gated = 1,
                     .rope_theta = 10000.0f,
                     .hd = 128};
    run_case(&c);
}

Test(gpu_layer, rope_partial_bias_post_layernorm_fp16)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_ERF,
                     .mode = STOF_TUNE_DEFAULT,
                     .rope_theta = 10000.0f,
                     .rope_dim = 32};
    run_case(&c);
}

Test(gpu_layer, rope_partial_grouped_bf16_cost_model)
{
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_TANH,
                     .mode = STOF_TUNE_CACHE_ONLY,
                     .heads = 4,
                     .kv_heads = 2,
                     .rope_theta = 500000.0f,
                     .rope_dim = 32};
    run_case(&c);
}

/* Heads of 80 channels: no tile of the Hopper template (64, 128, 192 or
 * 256 columns) holds whole heads, so every QKV candidate runs split (the
 * plain GEMM, then the rope kernel), on Hopper too; 40 pairs a head (five
 * groups of 8 in the kernel). */
Test(gpu_layer, rope_head_dim_80_runs_the_rope_kernel)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_DEFAULT,
                     .no_bias = 1,
                     .rope_theta = 10000.0f,
                     .hd = 80,
                     .rope_split = 1};
    run_case(&c);
}

/* Heads whose width is not hidden's (desc.head_dim): Qwen3 0.6B's 16
 * heads of 128 over a hidden of 1024, here 4 heads of 128 (512 columns)
 * over 256, with GQA, a QK norm and RoPE (tuned: the output projection's
 * K is 512); and narrower, 2 heads of 64 over 384 with
 * biases and LayerNorm (the cost model's choice). The key says head_dim. */
Test(gpu_layer, head_dim_wider_than_hidden_qwen3_bf16)
{
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_DEFAULT,
                     .heads = 4,
                     .kv_heads = 2,
                     .no_bias = 1,
                     .gated = 1,
                     .rope_theta = 1e6f,
                     .qk_norm = 1,
                     .hd = 128,
                     .hidden = 256};
    run_case(&c);
}

Test(gpu_layer, head_dim_narrower_than_hidden_fp16_cost_model)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .pre = 0,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_TANH,
                     .mode = STOF_TUNE_CACHE_ONLY,
                     .heads = 2,
                     .rope_theta = 10000.0f,
                     .hd = 64,
                     .hidden = 384};
    run_case(&c);
}

/* A QK norm (Qwen3's q_norm and k_norm): each Q and K head RMS-normalised
 * after the plain QKV product, then rotated, by the qk kernel; its
 * weights after w_qkv's rows. A Qwen3-style layer (GQA, SwiGLU, no
 * biases, pre-RMSNorm, theta 1e6; tuned: every QKV candidate verified
 * with the kernel), and a QK norm without RoPE over heads of 64 with
 * biases (the cost model's choice). */
Test(gpu_layer, qk_norm_qwen3_style_bf16)
{
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_DEFAULT,
                     .heads = 4,
                     .kv_heads = 2,
                     .no_bias = 1,
                     .gated = 1,
                     .rope_theta = 1e6f,
                     .qk_norm = 1,
                     .hd = 128};
    run_case(&c);
}

/* A QK norm over heads of 256 with a partial rotation (the first 40
 * channels: 20 pairs, a rotation not of 16) and biases. */
Test(gpu_layer, qk_norm_partial_rope_head_dim_256_fp16_cost_model)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_CACHE_ONLY,
                     .rope_theta = 10000.0f,
                     .rope_dim = 40,
                     .qk_norm = 1,
                     .hd = 256};
    run_case(&c);
}

Test(gpu_layer, qk_norm_without_rope_fp16_cost_model)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_GELU_TANH,
                     .mode = STOF_TUNE_CACHE_ONLY,
                     .qk_norm = 1};
    run_case(&c);
}

/* Rotations of channels that are not a multiple of 16 run the rope kernel
 * after the plain GEMM (2 pairs a thread step), on Hopper too: GPT-NeoX
 * 20B's 24 of 96 channels (tuned: every split candidate verified), and
 * StableLM 3B's 20 of 80 with a table of its own; a head of 72 rotated
 * whole (36 pairs). */
Test(gpu_layer, rope_dim_24_of_96_runs_the_rope_kernel)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .pre = 1,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_ERF,
                     .mode = STOF_TUNE_DEFAULT,
                     .rope_theta = 10000.0f,
                     .rope_dim = 24,
                     .hd = 96,
                     .rope_split = 1};
    run_case(&c);
}

Test(gpu_layer, rope_dim_20_of_80_table_bf16_cost_model)
{
    static float f[10];
    stof__rope_freqs(f, 20, 10000.0f);
    f[9] *= 0.25f; /* (a table of its own) */
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .pre = 1,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_TANH,
                     .mode = STOF_TUNE_CACHE_ONLY,
                     .rope_freq = f,
                     .rope_dim = 20,
                     .hd = 80,
                     .rope_split = 1};
    run_case(&c);
}

Test(gpu_layer, rope_whole_head_of_72_fp16)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_CACHE_ONLY,
                     .no_bias = 1,
                     .rope_theta = 500000.0f,
                     .hd = 72,
                     .rope_split = 1};
    run_case(&c);
}

/* A layer whose QKV GEMM always runs split (heads of 80: no Hopper tile
 * holds whole heads), tuned into a database; then, with the process's
 * kept cubins forgotten (a fresh process's view), planned again from the
 * database in a new context: a hit that compiles nothing (the rope kernel
 * comes from the layer's own norm module) and runs the same bits. */
Test(gpu_layer, rope_split_database_hit_compiles_nothing)
{
    char path[] = "/tmp/stof-layer-rope-split-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    unlink(path);
    stof_layer_desc d;
    stof_layer_desc_init(&d, 2, 128, 160, 2, STOF_DTYPE_FP16);
    d.ffn = 320;
    d.act = STOF_ACT_SILU;
    d.norm = STOF_NORM_RMS;
    d.pre_norm = 1;
    d.no_bias = 1;
    d.gated = 1;
    d.rope_theta = 10000.0f;
    const size_t n = (size_t)d.batch * d.seq * d.hidden;
    float *out[2] = {NULL, NULL};
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            stof__aux_memo_clear();
        stof_context *ctx = open_ctx(path, STOF_TUNE_DEFAULT);
        cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
        stof_mask *m = tu_make_mask(ctx, "bigbird:32:1:1:1:3", 128, 128);
        if (pass == 1) {
            /* Attention over heads of 80 runs the reference kernel, which
             * a context compiles once for any plan of that head size (no
             * record holds it): the layer's own attention plan, made
             * first, compiles it, so the count below is the layer's. */
            const int hd = d.hidden / d.heads;
            const int64_t qn = d.hidden + 2 * d.heads * hd, sq = d.seq;
            stof_attention_desc ad;
            stof_attention_desc_init(&ad, d.batch, d.heads, d.seq, d.seq, hd,
                                     d.dtype, STOF_LAYOUT_BSHD);
            ad.layout = STOF_LAYOUT_STRIDED;
            const int64_t qs[3] = {sq * qn, hd, qn};
            const int64_t os[3] = {sq * d.hidden, hd, d.hidden};
            memcpy(ad.q_stride, qs, sizeof(qs));
            memcpy(ad.k_stride, qs, sizeof(qs));
            memcpy(ad.v_stride, qs, sizeof(qs));
            memcpy(ad.o_stride, os, sizeof(os));
            stof_plan *ap = NULL;
            cr_assert_eq(stof_attention_plan(ctx, &ad, m, &ap), STOF_OK,
                         "%s", stof_errmsg(ctx));
            stof_plan_free(&ap);
        }
        const long c0 = stof__jit_compile_count();
        stof_layer *L = NULL;
        cr_assert_eq(stof_layer_plan(ctx, &d, m, &L), STOF_OK, "%s",
                     stof_errmsg(ctx));
        const long compiles = stof__jit_compile_count() - c0;
        char json[16384];
        cr_assert_eq(stof_layer_describe(L, json, sizeof(json), NULL),
                     STOF_OK);
        cr_log_info("pass %d, %ld compiles: %s", pass, compiles, json);
        cr_expect(strstr(json, "\"rope\":\"kernel\"") != NULL, "%s", json);
        if (pass == 1) {
            cr_expect(strstr(json, "\"source\":\"database\"") != NULL, "%s",
                      json);
            cr_expect_eq(compiles, 0,
                         "a database hit of a split-RoPE layer compiled %ld "
                         "kernels",
                         compiles);
        }
        tu_rng r = {0x5eedu};
        lw w;
        make_weights(&r, &d, &w);
        const stof_layer_weights lwt = as_weights(&w, &d);
        float *xf = NULL;
        const stof_api *api = stof__api();
        CUdeviceptr x = upload(&r, d.dtype, n, 1.0f, 0.0f, &xf), y = 0;
        cr_assert_eq(api->cuMemAlloc(&y, n * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemsetD8(y, 0xff, n * 2), CUDA_SUCCESS);
        cr_assert_eq(stof_layer_run(L, &lwt, (void *)(uintptr_t)x,
                                    (void *)(uintptr_t)y, NULL),
                     STOF_OK, "%s", stof_layer_errmsg(L));
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        out[pass] = malloc(n * sizeof(float));
        cr_assert(out[pass]);
        download(y, n, d.dtype, out[pass]);
        if (pass == 0) {
            float *ref = malloc(n * sizeof(float));
            cr_assert(ref);
            ref_layer(&d, m, &w, xf, ref);
            const double e = rel(out[0], ref, n);
            cr_log_info("split RoPE layer: relative error %.3g", e);
            cr_expect(e <= 1.5e-2, "relative error %.3g", e);
            free(ref);
        } else {
            cr_expect(memcmp(out[1], out[0], n * sizeof(float)) == 0,
                      "the database plan's output differs (rel %.3g)",
                      rel(out[1], out[0], n));
        }
        api->cuMemFree(x);
        api->cuMemFree(y);
        free(xf);
        free_weights(&w);
        stof_layer_free(&L);
        stof_mask_free(&m);
        stof__ctx_pop(ctx);
        stof_close(&ctx);
    }
    free(out[0]);
    free(out[1]);
    unlink(path);
}

/* Heads of 96 channels (4 query heads on 2, tuned): the Hopper template
 * holds whole heads of 96 only in its 192-wide tiles, so on compute
 * capability 9.0 the rotation is fused there or runs as the rope kernel
 * after another kernel (either choice passes; expect_rope_desc checks
 * that "fused" names a Hopper tile whose width is a multiple of 96).
 * Heads of 256 (tuned, Llama 3's base): 128 pairs a head, one head a
 * 256-wide tile. */
Test(gpu_layer, rope_head_dim_96_grouped_fp16)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_DEFAULT,
                     .heads = 4,
                     .kv_heads = 2,
                     .no_bias = 1,
                     .rope_theta = 10000.0f,
                     .hd = 96};
    run_case(&c);
}

Test(gpu_layer, rope_head_dim_256_bias_post_layernorm_bf16)
{
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_TANH,
                     .mode = STOF_TUNE_DEFAULT,
                     .heads = 2,
                     .rope_theta = 500000.0f,
                     .hd = 256};
    run_case(&c);
}

/* 3 causal sequences of 200 tokens: 600 rows, so the last tile of 128
 * rows is partial (an M tail) and tiles straddle sequences, whose
 * positions wrap to 0 where each sequence starts (token % 200). Tuned
 * over heads of 128 (on Hopper the fused epilogue competes), and the
 * cost model's choice rotating half of heads of 64. */
Test(gpu_layer, rope_seq_200_tail_tuned_bf16)
{
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_DEFAULT,
                     .no_bias = 1,
                     .rope_theta = 10000.0f,
                     .hd = 128,
                     .batch = 3,
                     .seq = 200,
                     .mask = "causal"};
    run_case(&c);
}

Test(gpu_layer, rope_seq_200_tail_partial_fp16_cost_model)
{
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .norm = STOF_NORM_LAYER,
                     .act = STOF_ACT_GELU_ERF,
                     .mode = STOF_TUNE_CACHE_ONLY,
                     .rope_theta = 10000.0f,
                     .rope_dim = 32,
                     .batch = 3,
                     .seq = 200,
                     .mask = "causal"};
    run_case(&c);
}

/* A RoPE family layer (pre-RMSNorm, SiLU, no biases, theta 10000 over
 * whole heads; the cost model's plan) over causal sequences of their own
 * lengths padded to 192 tokens (tiles of 128 rows straddle sequences):
 * each token rotates by its position in its padded sequence (token %
 * seq) whatever the lengths. New lengths each call (two runs, then a
 * graph stack of one layer); every sequence's valid rows (the padding
 * rows' values are not meaningful) against the reference layer with that
 * sequence's mask. Nothing is compiled after the plan. */
Test(gpu_layer, rope_family_causal_lengths_bf16)
{
    stof_context *ctx = open_ctx("", STOF_TUNE_CACHE_ONLY);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    enum { B = 3, S = 192 };
    const stof_dtype dt = STOF_DTYPE_BF16;
    stof_layer_desc d;
    stof_layer_desc_init(&d, B, S, 128, 2, dt);
    d.ffn = 256;
    d.pre_norm = 1;
    d.norm = STOF_NORM_RMS;
    d.act = STOF_ACT_SILU;
    d.no_bias = 1;
    d.rope_theta = 10000.0f;
    tu_rng r = {tu_seed() ^ 0xf0be5u};
    lw w;
    make_weights(&r, &d, &w);
    const size_t per = (size_t)S * d.hidden, n = (size_t)B * per;
    float *xf = NULL, *yf = malloc(n * sizeof(float)),
          *ref = malloc(per * sizeof(float));
    cr_assert(yf && ref);
    const stof_api *api = stof__api();
    CUdeviceptr x = upload(&r, dt, n, 1.0f, 0.0f, &xf), y = 0, dl = 0;
    cr_assert_eq(api->cuMemAlloc(&y, n * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&dl, sizeof(int32_t) * B), CUDA_SUCCESS);
    stof_mask_family *fam = NULL;
    cr_assert_eq(stof_mask_family_create(ctx, "causal", &fam), STOF_OK, "%s",
                 stof_errmsg(ctx));
    stof_layer *L = NULL;
    cr_assert_eq(stof_layer_plan_family(ctx, &d, fam, NULL, &L), STOF_OK,
                 "%s", stof_errmsg(ctx));
    char desc[16384];
    cr_assert_eq(stof_layer_describe(L, desc, sizeof(desc), NULL), STOF_OK);
    cr_log_info("RoPE family layer: %s", desc);
    expect_rope_desc(L, &d, desc);
    const stof_layer_weights lwt = as_weights(&w, &d);
    const long compiles = stof__jit_compile_count();
    int32_t len[B];
    stof_mask_data hd, dv;
    memset(&hd, 0, sizeof(hd));
    memset(&dv, 0, sizeof(dv));
    hd.q_len = hd.k_len = len;
    dv.q_len = dv.k_len = (const int32_t *)(uintptr_t)dl;
    stof_layer_desc d1 = d;
    d1.batch = 1;
    const double tol = 4e-2;
    /* Call 0: a whole sequence, one within the first tile of rows, one
     * past it; then random lengths. */
    static const int32_t first[B] = {S, 37, 150};
    for (int call = 0; call < 3; call++) {
        for (int b = 0; b < B; b++)
            len[b] = call == 0 ? first[b] : 1 + (int)tu_below(&r, S);
        cr_assert_eq(api->cuMemcpyHtoD(dl, len, sizeof(len)), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemsetD8(y, 0xff, n * 2), CUDA_SUCCESS);
        const stof_status st =
            call < 2
                ? stof_layer_run_family(L, &dv, &lwt, (void *)(uintptr_t)x,
                                        (void *)(uintptr_t)y, NULL)
                : stof_layer_stack_run_family(L, &dv, 1, &lwt,
                                              (void *)(uintptr_t)x,
                                              (void *)(uintptr_t)y, NULL,
                                              STOF_STACK_GRAPH);
        cr_assert_eq(st, STOF_OK, "call %d: %s", call, stof_layer_errmsg(L));
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        download(y, n, dt, yf);
        for (int b = 0; b < B; b++) {
            stof_mask *m = NULL;
            cr_assert_eq(stof_mask_family_eval(ctx, fam, S, S, &hd, b, &m),
                         STOF_OK, "%s", stof_errmsg(ctx));
            ref_layer(&d1, m, &w, xf + b * per, ref);
            const double e =
                rel(yf + b * per, ref, (size_t)len[b] * d.hidden);
            cr_log_info("RoPE family call %d sequence %d (length %d): "
                        "relative error %.3g",
                        call, b, len[b], e);
            cr_expect(e <= tol, "call %d sequence %d (length %d): relative "
                                "error %.3g > %.3g",
                      call, b, len[b], e, tol);
            stof_mask_free(&m);
        }
    }
    cr_assert_eq(stof__jit_compile_count(), compiles,
                 "a run compiled something");
    stof_layer_free(&L);
    stof_mask_family_free(&fam);
    api->cuMemFree(dl);
    api->cuMemFree(y);
    api->cuMemFree(x);
    free_weights(&w);
    free(xf);
    free(yf);
    free(ref);
    stof__ctx_pop(ctx);
    stof_close(&ctx);
}

/* Runs layer L (description d, mask m, weights w) on x (its host copy
 * xf) into y, poisoned first, and expects the reference layer's output
 * within the dtype's tolerance. yf and ref: room for the output. */
static void expect_layer_run(stof_layer *L, const stof_layer_desc *d,
                             const stof_mask *m, const lw *w, CUdeviceptr x,
                             const float *xf, CUdeviceptr y, float *yf,
                             float *ref, const char *what)
{
    const stof_api *api = stof__api();
    const size_t n = (size_t)d->batch * d->seq * d->hidden;
    const stof_layer_weights lwt = as_weights(w, d);
    cr_assert_eq(api->cuMemsetD8(y, 0xff, n * 2), CUDA_SUCCESS);
    cr_assert_eq(stof_layer_run(L, &lwt, (const void *)(uintptr_t)x,
                                (void *)(uintptr_t)y, NULL),
                 STOF_OK, "%s: %s", what, stof_layer_errmsg(L));
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
    download(y, n, d->dtype, yf);
    ref_layer(d, m, w, xf, ref);
    const double e = rel(yf, ref, n);
    const double tol = d->dtype == STOF_DTYPE_FP16 ? 1.5e-2 : 4e-2;
    cr_log_info("%s (theta %g, hidden %d): relative error %.3g", what,
                (double)d->rope_theta, d->hidden, e);
    cr_expect(e <= tol, "%s (theta %g, hidden %d): relative error %.3g > "
                        "%.3g",
              what, (double)d->rope_theta, d->hidden, e, tol);
}

/* RoPE tables are the context's (rope_cache.c), keyed by length, rotated
 * channels and base, and counted by the plans holding them: two layers
 * with heads of 64 (2 and 4 of them) share one, and the first one's free
 * leaves it to the second. While that one lives, ten layers of ten other
 * bases are planned (the context keeps 8 tables, one of them the second
 * layer's, which must not be taken: the last three of the ten own
 * theirs, freed by their stof_layer_free); each matches its reference,
 * and so does the second layer after them. Once all are freed, a new plan of the first of
 * the ten bases takes the table the context kept, and still matches after
 * a plan of the last base took a slot no plan held. Cost-model plans:
 * nothing is timed. */
Test(gpu_layer, rope_tables_shared_by_a_context)
{
    stof_context *ctx = open_ctx("", STOF_TUNE_CACHE_ONLY);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    enum { S = 64, N_THETA = 10 };
    static const float theta[N_THETA] = {50.0f,    150.0f,   400.0f,
                                         1000.0f,  3000.0f,  8000.0f,
                                         20000.0f, 60000.0f, 200000.0f,
                                         500000.0f};
    const stof_dtype dt = STOF_DTYPE_FP16;
    stof_mask *m = tu_make_mask(ctx, "causal", S, S);
    stof_layer_desc d2, d4;
    stof_layer_desc_init(&d2, 1, S, 128, 2, dt);
    d2.ffn = 256;
    d2.pre_norm = 1;
    d2.norm = STOF_NORM_RMS;
    d2.act = STOF_ACT_SILU;
    d2.rope_theta = 10000.0f;
    d4 = d2; /* heads of 64 too: the same table */
    d4.hidden = 256;
    d4.heads = 4;
    tu_rng r = {tu_seed() ^ 0x7ab1eu};
    lw w2, w4;
    make_weights(&r, &d2, &w2);
    make_weights(&r, &d4, &w4);
    const size_t n2 = (size_t)S * d2.hidden, n4 = (size_t)S * d4.hidden;
    float *x2f = NULL, *x4f = NULL, *yf = malloc(n4 * sizeof(float)),
          *ref = malloc(n4 * sizeof(float));
    cr_assert(yf && ref);
    const stof_api *api = stof__api();
    CUdeviceptr x2 = upload(&r, dt, n2, 1.0f, 0.0f, &x2f),
                x4 = upload(&r, dt, n4, 1.0f, 0.0f, &x4f), y = 0;
    cr_assert_eq(api->cuMemAlloc(&y, n4 * 2), CUDA_SUCCESS);
    /* One table for both. */
    stof_layer *La = NULL, *Lb = NULL;
    cr_assert_eq(stof_layer_plan(ctx, &d2, m, &La), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert_eq(stof_layer_plan(ctx, &d4, m, &Lb), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_assert(La->rope_tab && Lb->rope_tab);
    cr_expect_eq(Lb->rope_tab, La->rope_tab,
                 "two layers of one length and base: two tables");
    expect_layer_run(La, &d2, m, &w2, x2, x2f, y, yf, ref, "2 heads");
    stof_layer_free(&La);
    expect_layer_run(Lb, &d4, m, &w4, x4, x4f, y, yf, ref,
                     "4 heads, the first layer freed");
    /* Ten bases alive at once, beside Lb. */
    stof_layer *Ls[N_THETA] = {NULL};
    stof_layer_desc dl[N_THETA];
    char what[64], desc[16384];
    for (int i = 0; i < N_THETA; i++) {
        dl[i] = d2;
        dl[i].rope_theta = theta[i];
        cr_assert_eq(stof_layer_plan(ctx, &dl[i], m, &Ls[i]), STOF_OK,
                     "theta %g: %s", (double)theta[i], stof_errmsg(ctx));
        cr_assert(Ls[i]->rope_tab);
        cr_expect_neq(Ls[i]->rope_tab, Lb->rope_tab,
                      "theta %g took the table of theta %g",
                      (double)theta[i], (double)d4.rope_theta);
        for (int j = 0; j < i; j++)
            cr_expect_neq(Ls[i]->rope_tab, Ls[j]->rope_tab,
                          "theta %g and %g: one table", (double)theta[i],
                          (double)theta[j]);
    }
    const CUdeviceptr tab0 = Ls[0]->rope_tab;
    for (int i = 0; i < N_THETA; i++) {
        if (i == 0 || i == N_THETA - 1) {
            cr_assert_eq(stof_layer_describe(Ls[i], desc, sizeof(desc), NULL),
                         STOF_OK);
            expect_rope_desc(Ls[i], &dl[i], desc);
        }
        snprintf(what, sizeof(what), "base %d of %d", i + 1, N_THETA);
        expect_layer_run(Ls[i], &dl[i], m, &w2, x2, x2f, y, yf, ref, what);
    }
    expect_layer_run(Lb, &d4, m, &w4, x4, x4f, y, yf, ref,
                     "4 heads, after ten other bases");
    for (int i = 0; i < N_THETA; i++) {
        stof_layer_free(&Ls[i]);
        cr_assert_null(Ls[i]);
    }
    stof_layer_free(&Lb);
    /* Planned again: the first base's table, kept by the context. */
    stof_layer *L0 = NULL, *L9 = NULL;
    cr_assert_eq(stof_layer_plan(ctx, &dl[0], m, &L0), STOF_OK, "%s",
                 stof_errmsg(ctx));
    cr_expect_eq(L0->rope_tab, tab0, "theta %g: its kept table not reused",
                 (double)theta[0]);
    expect_layer_run(L0, &dl[0], m, &w2, x2, x2f, y, yf, ref,
                     "the first base again");
    cr_assert_eq(stof_layer_plan(ctx, &dl[N_THETA - 1], m, &L9), STOF_OK,
                 "%s", stof_errmsg(ctx));
    cr_expect_neq(L9->rope_tab, L0->rope_tab);
    expect_layer_run(L9, &dl[N_THETA - 1], m, &w2, x2, x2f, y, yf, ref,
                     "the last base again");
    expect_layer_run(L0, &dl[0], m, &w2, x2, x2f, y, yf, ref,
                     "the first base, after the last one's plan");
    stof_layer_free(&L9);
    stof_layer_free(&L0);
    api->cuMemFree(y);
    api->cuMemFree(x4);
    api->cuMemFree(x2);
    free_weights(&w4);
    free_weights(&w2);
    free(x2f);
    free(x4f);
    free(yf);
    free(ref);
    stof_mask_free(&m);
    stof__ctx_pop(ctx);
    stof_close(&ctx);
}

/* A graph stack of 3 pre-norm RoPE layers (RMSNorm, SiLU, theta 10000
 * over whole heads; the cost model's plan) with distinct weights against
 * the reference layer applied 3 times, as are layer-by-layer runs; the
 * stack against those runs as stack_graph_matches_layer_runs has it (the
 * same bits, or within 1e-2 where each layer's input norm is fused into
 * the previous layer's last GEMM); replayed, the same bits. */
Test(gpu_layer, rope_stack_graph_against_the_reference)
{
    stof_context *ctx = open_ctx("", STOF_TUNE_CACHE_ONLY);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    enum { NL = 3 };
    stof_layer_desc d;
    stof_layer_desc_init(&d, 1, 128, 128, 2, STOF_DTYPE_FP16);
    d.ffn = 256;
    d.pre_norm = 1;
    d.norm = STOF_NORM_RMS;
    d.act = STOF_ACT_SILU;
    d.rope_theta = 10000.0f;
    stof_mask *m = tu_make_mask(ctx, "bigbird:32:1:1:1:3", 128, 128);
    tu_rng r = {tu_seed() ^ 0x57ac5u};
    lw w[NL];
    stof_layer_weights lwt[NL];
    for (int i = 0; i < NL; i++) {
        make_weights(&r, &d, &w[i]);
        lwt[i] = as_weights(&w[i], &d);
    }
    const size_t n = (size_t)d.batch * d.seq * d.hidden;
    float *xf = NULL, *a = malloc(n * 4), *b = malloc(n * 4),
          *first = malloc(n * 4), *ref = malloc(n * 4), *tmp = malloc(n * 4);
    cr_assert(a && b && first && ref && tmp);
    const stof_api *api = stof__api();
    CUdeviceptr x = upload(&r, d.dtype, n, 1.0f, 0.0f, &xf), y, y2;
    cr_assert_eq(api->cuMemAlloc(&y, n * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&y2, n * 2), CUDA_SUCCESS);
    stof_layer *L = NULL;
    cr_assert_eq(stof_layer_plan(ctx, &d, m, &L), STOF_OK, "%s",
                 stof_errmsg(ctx));
    char desc[16384];
    cr_assert_eq(stof_layer_describe(L, desc, sizeof(desc), NULL), STOF_OK);
    cr_log_info("RoPE stack layer: %s", desc);
    expect_rope_desc(L, &d, desc);
    const int fused = strstr(desc, "\"junction_b\":\"stack\"") != NULL;
    /* The reference, layer after layer. */
    memcpy(tmp, xf, n * 4);
    for (int i = 0; i < NL; i++) {
        ref_layer(&d, m, &w[i], tmp, ref);
        if (i + 1 < NL)
            memcpy(tmp, ref, n * 4);
    }
    const double tol = 1.5e-2;
    void *px = (void *)(uintptr_t)x, *py = (void *)(uintptr_t)y,
         *py2 = (void *)(uintptr_t)y2;
    /* layer by layer */
    cr_assert_eq(api->cuMemsetD8(y2, 0xff, n * 2), CUDA_SUCCESS);
    for (int i = 0; i < NL; i++)
        cr_assert_eq(stof_layer_run(L, &lwt[i], i ? py2 : px, py2, NULL),
                     STOF_OK, "%s", stof_layer_errmsg(L));
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
    download(y2, n, d.dtype, a);
    const double e_runs = rel(a, ref, n);
    cr_log_info("%d RoPE layer runs: relative error %.3g", NL, e_runs);
    cr_expect(e_runs <= tol, "%d layer runs: relative error %.3g > %.3g", NL,
              e_runs, tol);
    for (int rep = 0; rep < 2; rep++) { /* recorded, then replayed */
        cr_assert_eq(api->cuMemsetD8(y, 0xff, n * 2), CUDA_SUCCESS);
        cr_assert_eq(stof_layer_stack_run(L, NL, lwt, px, py, NULL,
                                          STOF_STACK_GRAPH),
                     STOF_OK, "%s", stof_layer_errmsg(L));
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        download(y, n, d.dtype, b);
        const double e = rel(b, ref, n), apart = rel(b, a, n);
        cr_log_info("RoPE graph stack %d (stack ending fused %d): relative "
                    "error %.3g, %.3g from the layer runs",
                    rep, fused, e, apart);
        cr_expect(e <= tol, "graph stack %d: relative error %.3g > %.3g",
                  rep, e, tol);
        if (fused)
            cr_expect(apart < 1e-2, "graph stack %d: %.3g from layer runs",
                      rep, apart);
        else
            cr_expect(memcmp(a, b, n * 4) == 0,
                      "graph stack %d differs from the layer runs", rep);
        if (rep == 0)
            memcpy(first, b, n * 4);
        else
            cr_expect(memcmp(first, b, n * 4) == 0,
                      "the replayed graph differs from its recording");
    }
    stof_layer_free(&L);
    api->cuMemFree(x);
    api->cuMemFree(y);
    api->cuMemFree(y2);
    for (int i = 0; i < NL; i++)
        free_weights(&w[i]);
    free(xf);
    free(a);
    free(b);
    free(first);
    free(ref);
    free(tmp);
    stof_mask_free(&m);
    stof__ctx_pop(ctx);
    stof_close(&ctx);
}

/* A stack of 3 layers with distinct weights: the graph replay, the plain
 * stack and layer-by-layer runs agree exactly (same kernels); new pointers
 * are captured again. */
Test(gpu_layer, stack_graph_matches_layer_runs)
{
    stof_context *ctx = open_ctx("", STOF_TUNE_CACHE_ONLY);
    cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
    stof_layer_desc d;
    stof_layer_desc_init(&d, 1, 128, 128, 2, STOF_DTYPE_FP16);
    d.pre_norm = 1;
    stof_mask *m = tu_make_mask(ctx, "bigbird:32:1:1:1:3", 128, 128);
    tu_rng r = {tu_seed() ^ 0x57ac4u};
    lw w[3];
    stof_layer_weights lwt[3];
    for (int i = 0; i < 3; i++) {
        make_weights(&r, &d, &w[i]);
        lwt[i] = as_weights(&w[i], &d);
    }
    const size_t n = (size_t)d.batch * d.seq * d.hidden;
    float *xf = NULL, *a = malloc(n * 4), *b = malloc(n * 4);
    cr_assert(a && b);
    CUdeviceptr x = upload(&r, d.dtype, n, 1.0f, 0.0f, &xf), y, y2;
    const stof_api *api = stof__api();
    cr_assert_eq(api->cuMemAlloc(&y, n * 2), CUDA_SUCCESS);
    cr_assert_eq(api->cuMemAlloc(&y2, n * 2), CUDA_SUCCESS);
    stof_layer *L = NULL;
    cr_assert_eq(stof_layer_plan(ctx, &d, m, &L), STOF_OK, "%s",
                 stof_errmsg(ctx));
    void *px = (void *)(uintptr_t)x, *py = (void *)(uintptr_t)y,
         *py2 = (void *)(uintptr_t)y2;
    /* layer by layer */
    cr_assert_eq(stof_layer_run(L, &lwt[0], px, py2, NULL), STOF_OK);
    cr_assert_eq(stof_layer_run(L, &lwt[1], py2, py2, NULL), STOF_OK);
    cr_assert_eq(stof_layer_run(L, &lwt[2], py2, py2, NULL), STOF_OK);
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
    download(y2, n, d.dtype, a);
    /* Where the scheme fuses the stack ending (each layer's last GEMM
     * also normalises for the next, which skips its input norm: the
     * model's choice on a Hopper GPU), the stack rounds differently from
     * layer runs; else it is the same kernels, bit for bit. */
    char desc[16384];
    cr_assert_eq(stof_layer_describe(L, desc, sizeof(desc), NULL), STOF_OK);
    const int fused = strstr(desc, "\"junction_b\":\"stack\"") != NULL;
    if (ctx->device.cc_major == 9 && ctx->device.cc_minor == 0)
        cr_expect(fused, "the stack ending is not fused on cc 9.0: %s", desc);
    float *first = malloc(n * 4);
    double *ga = malloc(n * 16), *gb = ga + n;
    cr_assert(first && ga);
    for (int rep = 0; rep < 3; rep++) {
        cr_assert_eq(api->cuMemsetD8(y, 0, n * 2), CUDA_SUCCESS);
        const unsigned flags = rep == 0 ? 0u : STOF_STACK_GRAPH;
        cr_assert_eq(stof_layer_stack_run(L, 3, lwt, px, py, NULL, flags),
                     STOF_OK, "%s", stof_layer_errmsg(L));
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        download(y, n, d.dtype, b);
        if (rep == 0)
            memcpy(first, b, n * 4);
        else
            cr_expect(memcmp(first, b, n * 4) == 0,
                      "graph stack run %d differs from the plain one", rep);
        if (fused) {
            for (size_t i = 0; i < n; i++) {
                ga[i] = a[i];
                gb[i] = b[i];
            }
            const double err = tu_rel_err(gb, ga, n);
            cr_expect(err < 1e-2, "stack run %d: %.3e from layer runs", rep,
                      err);
        } else {
            cr_expect(memcmp(a, b, n * 4) == 0,
                      "stack run %d (flags %u) differs", rep, flags);
        }
    }
    /* Programmatic launches: a plan of 128 tokens asks for them on cc 9.0
     * (unless STOF_PDL decides); with them forced off the stack is the
     * same bit for bit; a plan of 4096 tokens does not ask. */
    const char *pdl_env = getenv("STOF_PDL");
    if (!pdl_env || ((pdl_env[0] != '0' && pdl_env[0] != '1') ||
                     pdl_env[1] != '\0')) {
        const int hopper = ctx->device.cc_major >= 9;
        cr_expect(strstr(desc, hopper ? "\"pdl\":true" : "\"pdl\":false") !=
                      NULL,
                  "128 tokens on cc %d.%d: %s", ctx->device.cc_major,
                  ctx->device.cc_minor, desc);
        stof__pdl_set(0);
        cr_assert_eq(api->cuMemsetD8(y, 0, n * 2), CUDA_SUCCESS);
        cr_assert_eq(stof_layer_stack_run(L, 3, lwt, px, py, NULL, 0),
                     STOF_OK, "%s", stof_layer_errmsg(L));
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        download(y, n, d.dtype, b);
        cr_expect(memcmp(first, b, n * 4) == 0,
                  "the stack without programmatic launches differs");
        cr_assert_eq(stof_layer_describe(L, desc, sizeof(desc), NULL),
                     STOF_OK);
        cr_expect(strstr(desc, "\"pdl\":false") != NULL, "%s", desc);
        stof__pdl_set(-1);
        stof_layer_desc big = d;
        big.batch = 32; /* 4096 tokens */
        stof_layer *Lb = NULL;
        cr_assert_eq(stof_layer_plan(ctx, &big, m, &Lb), STOF_OK, "%s",
                     stof_errmsg(ctx));
        cr_assert_eq(stof_layer_describe(Lb, desc, sizeof(desc), NULL),
                     STOF_OK);
        cr_expect(strstr(desc, "\"pdl\":false") != NULL,
                  "4096 tokens: %s", desc);
        stof_layer_free(&Lb);
    }
    /* New pointers: the graph is recorded again. */
    cr_assert_eq(api->cuMemsetD8(y2, 0, n * 2), CUDA_SUCCESS);
    cr_assert_eq(stof_layer_stack_run(L, 3, lwt, px, py2, NULL,
                                      STOF_STACK_GRAPH),
                 STOF_OK);
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
    download(y2, n, d.dtype, b);
    cr_expect(memcmp(first, b, n * 4) == 0, "recaptured stack differs");
    /* One layer: no stack ending. */
    cr_assert_eq(api->cuMemsetD8(y, 0, n * 2), CUDA_SUCCESS);
    cr_assert_eq(stof_layer_stack_run(L, 1, lwt, px, py, NULL, 0), STOF_OK);
    cr_assert_eq(stof_layer_run(L, &lwt[0], px, py2, NULL), STOF_OK);
    cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
    download(y, n, d.dtype, a);
    download(y2, n, d.dtype, b);
    cr_expect(memcmp(a, b, n * 4) == 0, "a stack of one differs");
    free(first);
    free(ga);
    /* Errors: a NULL weight, a misaligned x, bad flags. */
    stof_layer_weights bad = lwt[1];
    bad.w_o = NULL;
    stof_layer_weights two[3] = {lwt[0], bad, lwt[2]};
    cr_expect_eq(stof_layer_stack_run(L, 3, two, px, py, NULL, 0),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(stof_layer_errmsg(L), "layer 1") &&
                  strstr(stof_layer_errmsg(L), "w_o"),
              "message: %s", stof_layer_errmsg(L));
    cr_expect_eq(stof_layer_run(L, &lwt[0], (char *)px + 2, py, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof_layer_stack_run(L, 3, lwt, px, py, NULL, 8u),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(stof_layer_stack_run(L, 0, lwt, px, py, NULL, 0),
                 STOF_ERR_INVALID_ARGUMENT);
    stof_layer_free(&L);
    api->cuMemFree(x);
    api->cuMemFree(y);
    api->cuMemFree(y2);
    for (int i = 0; i < 3; i++)
        free_weights(&w[i]);
    free(xf);
    free(a);
    free(b);
    stof_mask_free(&m);
    stof__ctx_pop(ctx);
    stof_close(&ctx);
}

/* A database file and its SQLite side files removed. */
static void unlink_db(const char *path)
{
    char side[4096];
    unlink(path);
    snprintf(side, sizeof(side), "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof(side), "%s-shm", path);
    unlink(side);
}

/* Programmatic launches in a layer's description: a plan the search
 * tuned (compute capability 9.0+, STOF_PDL not set) timed the stack both
 * ways and kept the faster beyond the margin (the token rule within it);
 * a database plan has no timings and gives the tuned plan's choice back
 * (*pdl_tuned, -1 until a tuned plan set it). */
static void expect_pdl(const stof_context *ctx, const char *json, int tuned,
                       int tokens, int *pdl_tuned)
{
    const char *pdl_env = getenv("STOF_PDL");
    const int pdl_forced = pdl_env &&
                           (pdl_env[0] == '0' || pdl_env[0] == '1') &&
                           pdl_env[1] == '\0';
    const char *pm = strstr(json, "\"pdl_ms\":");
    cr_assert(pm, "%s", json);
    const int pdl_on = strstr(json, "\"pdl\":true") != NULL;
    if (tuned && !pdl_forced && ctx->device.cc_major >= 9) {
        double off_ms = 0.0, on_ms = 0.0;
        cr_expect_eq(sscanf(pm, "\"pdl_ms\":{\"off\":%lf,\"on\":%lf}", &off_ms,
                            &on_ms),
                     2, "%.60s", pm);
        cr_expect(off_ms > 0.0 && on_ms > 0.0, "%.60s", pm);
        /* (the printed times, rounded: not checked next to the margin's
         * edges) */
        const double ratio = on_ms / off_ms;
        if (fabs(fabs(ratio - 1.0) - STOF_LAYER_PDL_MARGIN) > 1e-3)
            cr_expect_eq(pdl_on,
                         stof__layer_pdl_pick(off_ms, on_ms,
                                              tokens <= STOF_LAYER_PDL_TOKENS),
                         "%.60s", pm);
        *pdl_tuned = pdl_on;
    } else {
        cr_expect(strncmp(pm, "\"pdl_ms\":null", 13) == 0, "%.60s", pm);
        if (*pdl_tuned >= 0 && !tuned)
            cr_expect_eq(pdl_on, *pdl_tuned,
                         "the record's choice %d, the search's %d", pdl_on,
                         *pdl_tuned);
    }
}

/* Tuned once into a database, a second context loads the layer with no
 * compile and the same scheme. A plan from the database compiles nothing
 * (a gated layer: nothing but the gate kernel, and that only when its
 * first FFN GEMM runs split), and says where its time went. A third
 * context preloads the database's modules; its plan then loads none. */
static void database_hit(int gated)
{
    char path[] = "/tmp/stof-layer-db-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    unlink(path);
    char json[3][16384];
    long compiles_hit = -1; /* a plain database hit's (pass 1) */
    int pdl_tuned = -1;     /* the search's timed choice (pass 0) */
    for (int pass = 0; pass < 3; pass++) {
        stof_context *ctx = open_ctx(path, STOF_TUNE_DEFAULT);
        if (pass == 2) {
            /* A fresh context preloads the database's modules: the most
             * used one, then the rest, then nothing more. */
            int got = -1;
            cr_assert_eq(stof_preload(ctx, 1, &got), STOF_OK, "%s",
                         stof_errmsg(ctx));
            cr_expect_eq(got, 1, "max_modules 1 loaded %d", got);
            cr_assert_eq(stof_preload(ctx, 0, &got), STOF_OK, "%s",
                         stof_errmsg(ctx));
            cr_expect_gt(got, 0, "the rest: %d", got);
            const long pre = stof__module_preloads(ctx);
            cr_assert_eq(stof_preload(ctx, 0, &got), STOF_OK, "%s",
                         stof_errmsg(ctx));
            cr_expect_eq(got, 0, "a second preload loaded %d", got);
            cr_expect_eq(stof__module_preloads(ctx), pre);
            cr_log_info("preloaded %ld modules", pre);
        }
        stof_layer_desc d;
        stof_layer_desc_init(&d, 1, 128, 128, 2, STOF_DTYPE_FP16);
        if (gated) { /* Llama-style */
            d.gated = 1;
            d.ffn = 256;
            d.act = STOF_ACT_SILU;
            d.norm = STOF_NORM_RMS;
            d.pre_norm = 1;
            d.no_bias = 1;
        }
        stof_mask *m = tu_make_mask(ctx, "bigbird:32:1:1:1:3", 128, 128);
        const long c0 = stof__jit_compile_count();
        stof_layer *L = NULL;
        cr_assert_eq(stof_layer_plan(ctx, &d, m, &L), STOF_OK, "%s",
                     stof_errmsg(ctx));
        const long compiles = stof__jit_compile_count() - c0;
        if (pass == 2)
            cr_expect_eq(stof__module_shared_loads(ctx), 0,
                         "a plan after the preload loaded %ld modules",
                         stof__module_shared_loads(ctx));
        size_t need = 0;
        cr_assert_eq(stof_layer_describe(L, json[pass], sizeof(json[pass]),
                                         &need),
                     STOF_OK);
        cr_log_info("pass %d: %ld compiles: %s", pass, compiles, json[pass]);
        cr_expect(strstr(json[pass], "\"plan_ms\":{\"attention\":"), "%s",
                  json[pass]);
        expect_pdl(ctx, json[pass], pass == 0, d.batch * d.seq, &pdl_tuned);
        if (pass == 0) {
            cr_expect(strstr(json[0], "\"source\":\"tuned\""));
        } else if (pass == 2) {
            cr_expect(strstr(json[2], "\"source\":\"database\""));
            cr_expect_eq(compiles, compiles_hit,
                         "%ld compiles after the preload, %ld without",
                         compiles, compiles_hit);
        } else {
            /* The split FFN: cuBLASLt's, or the mma.sync template's. */
            const char *f1 = strstr(json[1], "\"op\":\"ffn1\"");
            const char *next = f1 ? strstr(f1 + 5, "\"op\":") : NULL;
            const char *wg0 = f1 ? strstr(f1, "\"wg\":0") : NULL;
            static const char lt_f1[] = "\"op\":\"ffn1\",\"kernel\":"
                                        "\"cublaslt\"";
            const int split =
                gated && f1 &&
                (strncmp(f1, lt_f1, sizeof(lt_f1) - 1) == 0 ||
                 (wg0 && (!next || wg0 < next)));
            cr_log_info("gated %d, first FFN GEMM split %d", gated, split);
            cr_expect_eq(compiles, split, "a database hit compiled %ld kernels",
                         compiles);
            compiles_hit = compiles;
            cr_expect(strstr(json[1], "\"source\":\"database\""));
            const char *s0 = strstr(json[0], "\"scheme\""),
                       *s1 = strstr(json[1], "\"scheme\"");
            cr_assert(s0 && s1);
            cr_expect(strncmp(s0, s1, 60) == 0, "schemes differ: %.60s / %.60s",
                      s0, s1);
            /* Planned again in this context: the modules are shared (none
             * loaded), and they outlive the first plan's free. */
            const long l0 = stof__module_shared_loads(ctx);
            cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
            stof_layer *L2 = NULL;
            cr_assert_eq(stof_layer_plan(ctx, &d, m, &L2), STOF_OK, "%s",
                         stof_errmsg(ctx));
            cr_expect_eq(stof__module_shared_loads(ctx), l0,
                         "a second plan loaded %ld modules",
                         stof__module_shared_loads(ctx) - l0);
            tu_rng r = {tu_seed() ^ 0xdb417u};
            lw w;
            make_weights(&r, &d, &w);
            const stof_layer_weights lwt = as_weights(&w, &d);
            const size_t n = (size_t)d.batch * d.seq * d.hidden;
            float *xf = NULL, *y1 = malloc(n * sizeof(float)),
                  *y2 = malloc(n * sizeof(float));
            cr_assert(y1 && y2);
            CUdeviceptr x = upload(&r, d.dtype, n, 1.0f, 0.0f, &xf), y;
            cr_assert_eq(stof__api()->cuMemAlloc(&y, n * 2), CUDA_SUCCESS);
            cr_assert_eq(stof_layer_run(L, &lwt, (void *)(uintptr_t)x,
                                        (void *)(uintptr_t)y, NULL),
                         STOF_OK, "%s", stof_layer_errmsg(L));
            cr_assert_eq(stof__api()->cuCtxSynchronize(), CUDA_SUCCESS);
            download(y, n, d.dtype, y1);
            stof_layer_free(&L);
            cr_assert_eq(stof_layer_run(L2, &lwt, (void *)(uintptr_t)x,
                                        (void *)(uintptr_t)y, NULL),
                         STOF_OK, "%s", stof_layer_errmsg(L2));
            cr_assert_eq(stof__api()->cuCtxSynchronize(), CUDA_SUCCESS);
            download(y, n, d.dtype, y2);
            cr_expect(memcmp(y1, y2, n * sizeof(float)) == 0,
                      "the second plan's output differs");
            stof_layer_free(&L2);
            stof__api()->cuMemFree(x);
            stof__api()->cuMemFree(y);
            free_weights(&w);
            free(xf);
            free(y1);
            free(y2);
            stof__ctx_pop(ctx);
        }
        stof_layer_free(&L);
        stof_mask_free(&m);
        stof_close(&ctx);
    }
    unlink_db(path);
}

Test(gpu_layer, database_hit_compiles_nothing)
{
    database_hit(0);
}

Test(gpu_layer, database_hit_of_a_gated_layer)
{
    database_hit(1);
}

/* A family layer tuned (the causal&docs family's default instance is what
 * the search times, its programmatic launches included), then planned from
 * the database in a fresh context: the same choice back, nothing
 * compiled, and the same output for one instance's data as a two-layer
 * graph stack. */
Test(gpu_layer, family_layer_tuned_then_from_the_database)
{
    char path[] = "/tmp/stof-layer-fam-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    unlink(path);
    enum { B = 2, S = 128 };
    int pdl_tuned = -1;
    float *out[2] = {NULL, NULL};
    size_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        stof_context *ctx = open_ctx(path, STOF_TUNE_DEFAULT);
        cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
        stof_layer_desc d;
        stof_layer_desc_init(&d, B, S, 128, 2, STOF_DTYPE_FP16);
        d.ffn = 256;
        d.act = STOF_ACT_GELU_ERF;
        d.pre_norm = 1; /* a fused stack ending where the scheme has one */
        stof_mask_family *fam = NULL;
        cr_assert_eq(stof_mask_family_create(ctx, "causal&docs", &fam),
                     STOF_OK);
        const long c0 = stof__jit_compile_count();
        stof_layer *L = NULL;
        cr_assert_eq(stof_layer_plan_family(ctx, &d, fam, NULL, &L), STOF_OK,
                     "%s", stof_errmsg(ctx));
        const long compiles = stof__jit_compile_count() - c0;
        char json[16384];
        cr_assert_eq(stof_layer_describe(L, json, sizeof(json), NULL),
                     STOF_OK);
        cr_log_info("pass %d: %ld compiles: %s", pass, compiles, json);
        cr_expect(strstr(json, pass ? "\"source\":\"database\""
                                    : "\"source\":\"tuned\""),
                  "%s", json);
        if (pass)
            cr_expect_eq(compiles, 0, "a database hit compiled %ld kernels",
                         compiles);
        expect_pdl(ctx, json, pass == 0, B * S, &pdl_tuned);
        /* The same weights, input and instance in both passes. */
        tu_rng r = {0x5eedfa3u};
        lw w[2];
        make_weights(&r, &d, &w[0]);
        make_weights(&r, &d, &w[1]);
        const stof_layer_weights lwt[2] = {as_weights(&w[0], &d),
                                           as_weights(&w[1], &d)};
        n = (size_t)B * S * d.hidden;
        float *xf = NULL;
        const stof_api *api = stof__api();
        CUdeviceptr x = upload(&r, d.dtype, n, 1.0f, 0.0f, &xf), y = 0,
                    dd = 0;
        cr_assert_eq(api->cuMemAlloc(&y, n * 2), CUDA_SUCCESS);
        int32_t len[B] = {S, 77}, doc[B * S];
        for (int i = 0; i < B * S; i++)
            doc[i] = (i % S) / 50;
        cr_assert_eq(api->cuMemAlloc(&dd, 4096 + sizeof(doc)), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemcpyHtoD(dd, len, sizeof(len)), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemcpyHtoD(dd + 4096, doc, sizeof(doc)),
                     CUDA_SUCCESS);
        stof_mask_data dv;
        memset(&dv, 0, sizeof(dv));
        dv.q_len = dv.k_len = (const int32_t *)(uintptr_t)dd;
        dv.doc_id = (const int32_t *)(uintptr_t)(dd + 4096);
        cr_assert_eq(api->cuMemsetD8(y, 0xff, n * 2), CUDA_SUCCESS);
        cr_assert_eq(stof_layer_stack_run_family(L, &dv, 2, lwt,
                                                 (void *)(uintptr_t)x,
                                                 (void *)(uintptr_t)y, NULL,
                                                 STOF_STACK_GRAPH),
                     STOF_OK, "%s", stof_layer_errmsg(L));
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        out[pass] = malloc(n * sizeof(float));
        cr_assert(out[pass]);
        download(y, n, d.dtype, out[pass]);
        for (size_t i = 0; i < n; i++)
            cr_assert(isfinite(out[pass][i]), "pass %d: y[%zu] = %g", pass,
                      i, out[pass][i]);
        api->cuMemFree(dd);
        api->cuMemFree(y);
        api->cuMemFree(x);
        free_weights(&w[0]);
        free_weights(&w[1]);
        free(xf);
        stof_layer_free(&L);
        stof_mask_family_free(&fam);
        stof__ctx_pop(ctx);
        stof_close(&ctx);
    }
    /* The same kernels: the same output (the search's timings may pick
     * another launch mode, never other values). */
    const double e = rel(out[1], out[0], n);
    cr_log_info("database plan against the tuned one: rel err %.3g", e);
    cr_expect(e <= 1e-6, "rel err %.3g", e);
    free(out[0]);
    free(out[1]);
    unlink_db(path);
}

/* The misses of one database, for find_miss: the problem JSON of key. */
typedef struct miss_find {
    const char *key;
    char problem[4096];
    int found;
} miss_find;

static int find_miss(void *user, const char *key, const char *problem_json,
                     const void *mask_bits, size_t mask_bytes, int64_t count)
{
    miss_find *f = user;
    (void)mask_bits;
    (void)mask_bytes;
    (void)count;
    if (strcmp(key, f->key))
        return 0;
    snprintf(f->problem, sizeof(f->problem), "%s", problem_json);
    f->found = 1;
    return 1;
}

/* A RoPE layer through the database: tuned into it (against the
 * reference), planned again in a fresh context (source "database", the
 * same key and the same output bit for bit), and in a cache-only context
 * (the same hit); there the same layer with Llama 3's base misses the
 * record (its key differs), takes the cost model's choice, records a miss
 * with its base and dim for `stof-tune pending`, and rotates with its own
 * table. */
Test(gpu_layer, rope_layer_tuned_then_from_the_database)
{
    char path[] = "/tmp/stof-layer-rope-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    unlink(path);
    stof_layer_desc d;
    stof_layer_desc_init(&d, 2, 128, 128, 2, STOF_DTYPE_FP16);
    d.ffn = 256;
    d.act = STOF_ACT_SILU;
    d.norm = STOF_NORM_RMS;
    d.pre_norm = 1;
    d.no_bias = 1;
    d.gated = 1;
    d.rope_theta = 10000.0f;
    d.rope_dim = 32;
    stof_layer_desc d3 = d; /* Llama 3's base */
    d3.rope_theta = 500000.0f;
    const size_t n = (size_t)d.batch * d.seq * d.hidden;
    const double tol = 1.5e-2;
    char key0[33] = "";
    float *out[3] = {NULL, NULL, NULL};
    for (int pass = 0; pass < 3; pass++) {
        stof_context *ctx = open_ctx(
            path, pass < 2 ? STOF_TUNE_DEFAULT : STOF_TUNE_CACHE_ONLY);
        cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
        stof_mask *m = tu_make_mask(ctx, "bigbird:32:1:1:1:3", 128, 128);
        stof_layer *L = NULL;
        cr_assert_eq(stof_layer_plan(ctx, &d, m, &L), STOF_OK, "%s",
                     stof_errmsg(ctx));
        char json[16384];
        cr_assert_eq(stof_layer_describe(L, json, sizeof(json), NULL),
                     STOF_OK);
        cr_log_info("pass %d: %s", pass, json);
        cr_expect(strstr(json, pass ? "\"source\":\"database\""
                                    : "\"source\":\"tuned\"") != NULL,
                  "pass %d: %s", pass, json);
        expect_rope_desc(L, &d, json);
        if (pass == 0)
            snprintf(key0, sizeof(key0), "%s", L->key);
        else
            cr_expect_str_eq(L->key, key0);
        /* The same weights and input in every pass. */
        tu_rng r = {0x20be5u};
        lw w;
        make_weights(&r, &d, &w);
        const stof_layer_weights lwt = as_weights(&w, &d);
        float *xf = NULL;
        const stof_api *api = stof__api();
        CUdeviceptr x = upload(&r, d.dtype, n, 1.0f, 0.0f, &xf), y = 0;
        cr_assert_eq(api->cuMemAlloc(&y, n * 2), CUDA_SUCCESS);
        cr_assert_eq(api->cuMemsetD8(y, 0xff, n * 2), CUDA_SUCCESS);
        cr_assert_eq(stof_layer_run(L, &lwt, (void *)(uintptr_t)x,
                                    (void *)(uintptr_t)y, NULL),
                     STOF_OK, "%s", stof_layer_errmsg(L));
        cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
        out[pass] = malloc(n * sizeof(float));
        float *ref = malloc(n * sizeof(float));
        cr_assert(out[pass] && ref);
        download(y, n, d.dtype, out[pass]);
        if (pass == 0) {
            ref_layer(&d, m, &w, xf, ref);
            const double e = rel(out[0], ref, n);
            cr_log_info("tuned RoPE layer: relative error %.3g", e);
            cr_expect(e <= tol, "relative error %.3g > %.3g", e, tol);
        } else {
            cr_expect(memcmp(out[pass], out[0], n * sizeof(float)) == 0,
                      "pass %d: the database plan's output differs from the "
                      "tuned plan's (rel %.3g)",
                      pass, rel(out[pass], out[0], n));
        }
        if (pass == 2) {
            /* Another base: another key, a miss, the model's plan. */
            stof_layer *L3 = NULL;
            cr_assert_eq(stof_layer_plan(ctx, &d3, m, &L3), STOF_OK, "%s",
                         stof_errmsg(ctx));
            cr_assert_eq(stof_layer_describe(L3, json, sizeof(json), NULL),
                         STOF_OK);
            cr_log_info("theta %g: %s", (double)d3.rope_theta, json);
            cr_expect(strstr(json, "\"source\":\"model\"") != NULL, "%s",
                      json);
            cr_expect_str_neq(L3->key, key0);
            expect_rope_desc(L3, &d3, json);
            miss_find f = {.key = L3->key};
            cr_assert_eq(stof__db_foreach_miss(stof__ctx_db(ctx), find_miss,
                                               &f),
                         STOF_OK);
            cr_expect(f.found, "no miss recorded under %s", L3->key);
            cr_expect(strstr(f.problem, "\"rope_theta\":500000") != NULL &&
                          strstr(f.problem, "\"rope_dim\":32") != NULL,
                      "miss %s", f.problem);
            cr_assert_eq(api->cuMemsetD8(y, 0xff, n * 2), CUDA_SUCCESS);
            cr_assert_eq(stof_layer_run(L3, &lwt, (void *)(uintptr_t)x,
                                        (void *)(uintptr_t)y, NULL),
                         STOF_OK, "%s", stof_layer_errmsg(L3));
            cr_assert_eq(api->cuCtxSynchronize(), CUDA_SUCCESS);
            float *y3 = malloc(n * sizeof(float));
            cr_assert(y3);
            download(y, n, d.dtype, y3);
            ref_layer(&d3, m, &w, xf, ref);
            const double e = rel(y3, ref, n), apart = rel(y3, out[0], n);
            cr_log_info("theta %g: relative error %.3g, %.3g from theta %g",
                        (double)d3.rope_theta, e, apart,
                        (double)d.rope_theta);
            cr_expect(e <= tol, "relative error %.3g > %.3g", e, tol);
            /* (the base matters: nearer its own reference than the
             * first base's output) */
            cr_expect(apart > 2 * e, "theta %g and %g: outputs %.3g apart",
                      (double)d3.rope_theta, (double)d.rope_theta, apart);
            free(y3);
            stof_layer_free(&L3);
        }
        free(ref);
        api->cuMemFree(y);
        api->cuMemFree(x);
        free_weights(&w);
        free(xf);
        stof_layer_free(&L);
        stof_mask_free(&m);
        stof__ctx_pop(ctx);
        stof_close(&ctx);
    }
    for (int i = 0; i < 3; i++)
        free(out[i]);
    unlink_db(path);
}

/* Llama 3.1's frequencies (Hugging Face's rope type "llama3"): theta's,
 * those of wavelengths above orig / lo divided by factor, those between
 * orig / hi and orig / lo blended, in fp32 as transformers computes them
 * (the test's own formula: the library takes any table). */
static void llama3_freqs(float *f, int rope, float theta, float factor,
                         float lo, float hi, float orig)
{
    stof__rope_freqs(f, rope, theta);
    const float low_wl = orig / lo, high_wl = orig / hi;
    for (int i = 0; i < rope / 2; i++) {
        const float wl = 2.0f * 3.14159265358979f / f[i];
        if (wl > low_wl)
            f[i] /= factor;
        else if (wl >= high_wl) {
            const float sm = (orig / wl - lo) / (hi - lo);
            f[i] = (1.0f - sm) * f[i] / factor + sm * f[i];
        }
    }
}

/* RoPE with frequencies of the layer's own (desc.rope_freq: Llama 3.1's
 * scaled ones) and a scale on cos and sin (yarn's attention factor),
 * against the reference rotating with the same table: a tuned Llama-style
 * layer (on Hopper the fused epilogue competes with the split forms), and
 * heads of 80 (always split: the rope kernel reads the same table). */
Test(gpu_layer, rope_table_llama3_scaled_bf16)
{
    static float f[64];
    llama3_freqs(f, 128, 500000.0f, 8.0f, 1.0f, 4.0f, 64.0f);
    const lcase c = {.dt = STOF_DTYPE_BF16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_DEFAULT,
                     .heads = 4,
                     .kv_heads = 2,
                     .no_bias = 1,
                     .gated = 1,
                     .rope_freq = f,
                     .rope_scale = 1.25f,
                     .hd = 128};
    run_case(&c);
}

Test(gpu_layer, rope_table_head_dim_80_kernel_fp16)
{
    static float f[40];
    for (int i = 0; i < 40; i++) /* (any table: falling, one 0) */
        f[i] = i == 39 ? 0.0f : 1.5f / (1.0f + (float)i);
    const lcase c = {.dt = STOF_DTYPE_FP16,
                     .pre = 1,
                     .norm = STOF_NORM_RMS,
                     .act = STOF_ACT_SILU,
                     .mode = STOF_TUNE_CACHE_ONLY,
                     .no_bias = 1,
                     .rope_freq = f,
                     .rope_scale = 0.75f,
                     .hd = 80,
                     .rope_split = 1};
    run_case(&c);
}

/* One record serves every table of its rope_dim: a layer with its own
 * frequencies (Llama 3.1's) tuned into a database; in a new context, the
 * same layer with other frequencies and a scale loads that record (source
 * "database", the same key) and rotates with its own table: each output
 * matches its own reference, and the two differ. The context shares a
 * device table between plans of the same bits (a copy of the frequencies
 * in another buffer), not between different ones. A layer with a base
 * instead (theta) has another key: a cache-only plan of it misses. */
Test(gpu_layer, rope_tables_share_one_record)
{
    char path[] = "/tmp/stof-layer-rope-table-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    unlink(path);
    static float fa[32], fa2[32], fb[32];
    llama3_freqs(fa, 64, 10000.0f, 8.0f, 1.0f, 4.0f, 32.0f);
    memcpy(fa2, fa, sizeof(fa));
    for (int i = 0; i < 32; i++)
        fb[i] = 0.02f + 0.5f * (float)((i * 7) % 32) / 32.0f;
    stof_layer_desc da;
    stof_layer_desc_init(&da, 2, 128, 128, 2, STOF_DTYPE_FP16);
    da.ffn = 256;
    da.act = STOF_ACT_SILU;
    da.norm = STOF_NORM_RMS;
    da.pre_norm = 1;
    da.no_bias = 1;
    da.gated = 1;
    da.rope_freq = fa;
    stof_layer_desc db = da, da2 = da, dt = da;
    db.rope_freq = fb;
    db.rope_scale = 1.3f;
    da2.rope_freq = fa2;
    dt.rope_freq = NULL;
    dt.rope_theta = 10000.0f;
    const stof_api *api = stof__api();
    const size_t n = (size_t)da.batch * da.seq * da.hidden;
    char key0[33] = "";
    for (int pass = 0; pass < 2; pass++) {
        stof_context *ctx = open_ctx(path, STOF_TUNE_DEFAULT);
        cr_assert_eq(stof__ctx_push(ctx), STOF_OK);
        stof_mask *m = tu_make_mask(ctx, "bigbird:32:1:1:1:3", 128, 128);
        tu_rng r = {0x7ab7e5u};
        lw w;
        make_weights(&r, &da, &w);
        float *xf = NULL, *ya = malloc(n * sizeof(float)),
              *yb = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
        cr_assert(ya && yb && ref);
        CUdeviceptr x = upload(&r, da.dtype, n, 1.0f, 0.0f, &xf), y = 0;
        cr_assert_eq(api->cuMemAlloc(&y, n * 2), CUDA_SUCCESS);
        stof_layer *La = NULL, *Lb = NULL, *La2 = NULL;
        cr_assert_eq(stof_layer_plan(ctx, &da, m, &La), STOF_OK, "%s",
                     stof_errmsg(ctx));
        char json[16384];
        cr_assert_eq(stof_layer_describe(La, json, sizeof(json), NULL),
                     STOF_OK);
        cr_expect(strstr(json, pass ? "\"source\":\"database\""
                                    : "\"source\":\"tuned\"") != NULL,
                  "pass %d: %s", pass, json);
        expect_rope_desc(La, &da, json);
        if (pass == 0)
            snprintf(key0, sizeof(key0), "%s", La->key);
        cr_expect_str_eq(La->key, key0);
        expect_layer_run(La, &da, m, &w, x, xf, y, ya, ref, "llama3 table");
        if (pass == 1) {
            cr_assert_eq(stof_layer_plan(ctx, &db, m, &Lb), STOF_OK, "%s",
                         stof_errmsg(ctx));
            cr_assert_eq(stof_layer_describe(Lb, json, sizeof(json), NULL),
                         STOF_OK);
            cr_log_info("other table: %s", json);
            cr_expect(strstr(json, "\"source\":\"database\"") != NULL, "%s",
                      json);
            cr_expect_str_eq(Lb->key, key0);
            expect_rope_desc(Lb, &db, json);
            cr_expect_neq(Lb->rope_tab, La->rope_tab,
                          "two tables' plans share one device table");
            cr_assert_eq(stof_layer_plan(ctx, &da2, m, &La2), STOF_OK, "%s",
                         stof_errmsg(ctx));
            cr_expect_eq(La2->rope_tab, La->rope_tab,
                         "the same frequencies: two device tables");
            expect_layer_run(Lb, &db, m, &w, x, xf, y, yb, ref,
                             "another table, scaled");
            const double e = rel(yb, ref, n), apart = rel(yb, ya, n);
            cr_log_info("tables apart: %.3g (own reference %.3g)", apart, e);
            cr_expect(apart > 2 * e, "two tables' outputs %.3g apart", apart);
            /* (the first plan still rotates with its own) */
            expect_layer_run(La, &da, m, &w, x, xf, y, ya, ref,
                             "llama3 table, again");
            stof_layer_free(&La2);
            stof_layer_free(&Lb);
            /* a base instead: another key (cache-only: a miss) */
            stof_context *cc = open_ctx(path, STOF_TUNE_CACHE_ONLY);
            stof_layer *Lt = NULL;
            cr_assert_eq(stof_layer_plan(cc, &dt, m, &Lt), STOF_OK, "%s",
                         stof_errmsg(cc));
            cr_assert_eq(stof_layer_describe(Lt, json, sizeof(json), NULL),
                         STOF_OK);
            cr_expect(strstr(json, "\"source\":\"model\"") != NULL, "%s",
                      json);
            cr_expect_str_neq(Lt->key, key0);
            stof_layer_free(&Lt);
            stof_close(&cc);
        }
        stof_layer_free(&La);
        api->cuMemFree(y);
        api->cuMemFree(x);
        free_weights(&w);
        free(xf);
        free(ya);
        free(yb);
        free(ref);
        stof_mask_free(&m);
        stof__ctx_pop(ctx);
        stof_close(&ctx);
    }
    unlink_db(path);
}

__attribute__((visibility("default"))) int main(int argc, char **argv)
{
    return tu_gpu_suite_main("gpu layer", argc, argv);
}
