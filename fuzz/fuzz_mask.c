/*
 * fuzz_mask.c - libFuzzer target for the mask layer: the spec parser and
 * evaluator, packing from dense bytes, the digest and the sparse formats.
 *
 * Input: bytes 0..2 choose seq_q and seq_k (1..300 each); the rest is a mask
 * spec (NUL-terminated copy) and, read as bytes, a dense mask.
 * Invariants that do not hold call abort(), which libFuzzer reports.
 *
 * Build and run (needs clang; from the repository root):
 *     CC=clang meson setup /tmp/build-fuzz -Dfuzzer=true -Dtests=false \
 *         -Dbench=false
 *     ninja -C /tmp/build-fuzz fuzz/fuzz_mask
 *     mkdir -p fuzz/corpus-run
 *     /tmp/build-fuzz/fuzz/fuzz_mask fuzz/corpus-run fuzz/corpus \
 *         -dict=fuzz/mask.dict -max_total_time=60 -max_len=512
 * fuzz/corpus is the seed corpus (kept in git, replayed by every build via
 * tests/test_fuzz_corpus.c); fuzz/corpus-run collects new inputs (ignored).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stof.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static stof_context *fuzz_ctx(void)
{
    static stof_context *ctx;
    if (!ctx) {
        stof_settings s;
        stof_default_settings(&s);
        if (stof_open(&ctx, &s) != STOF_OK)
            abort();
    }
    return ctx;
}

static int popcount32(uint32_t x)
{
    int n = 0;
    for (; x; x &= x - 1)
        n++;
    return n;
}

/* Check a format against its mask's counts; abort() on any mismatch. */
static void check_format(stof_context *ctx, const stof_mask *m, int bm, int bn)
{
    stof_format *f = NULL;
    if (stof_format_build(ctx, m, bm, bn, &f) != STOF_OK || !f)
        abort();
    const int sq = stof_mask_seq_q(m), sk = stof_mask_seq_k(m);
    const int nrb = f->n_row_blocks, ncb = f->n_col_blocks;
    if (nrb != (sq + bm - 1) / bm || ncb != (sk + bn - 1) / bn)
        abort();
    if (f->n_full + f->n_partial + f->n_empty != (int64_t)nrb * ncb)
        abort();
    if (f->row_ptr[0] != 0 || f->row_ptr[nrb] != f->n_full + f->n_partial)
        abort();
    if (f->allowed != stof_mask_count(m))
        abort();
    /* Full tile areas plus partial bitmap bits add up to the count. */
    uint64_t sum = 0;
    int64_t full = 0, partial = 0;
    for (int i = 0; i < nrb; i++) {
        if (f->row_ptr[i + 1] < f->row_ptr[i])
            abort();
        int rows = sq - i * bm < bm ? sq - i * bm : bm;
        for (int64_t e = f->row_ptr[i]; e < f->row_ptr[i + 1]; e++) {
            int j = f->col_idx[e];
            if (j < 0 || j >= ncb || (e > f->row_ptr[i] && j <= f->col_idx[e - 1]))
                abort();
            int cols = sk - j * bn < bn ? sk - j * bn : bn;
            if (f->kind[e] == STOF_TILE_FULL) {
                if (f->bitmap_idx[e] != -1)
                    abort();
                sum += (uint64_t)rows * (uint64_t)cols;
                full++;
            } else if (f->kind[e] == STOF_TILE_PARTIAL) {
                if (f->bitmap_idx[e] != partial)
                    abort();
                const uint32_t *b = f->bitmaps + (size_t)partial * bm *
                                                     f->bitmap_words_per_row;
                uint64_t c = 0;
                for (int w = 0; w < bm * f->bitmap_words_per_row; w++)
                    c += (uint64_t)popcount32(b[w]);
                if (c == 0 || c >= (uint64_t)rows * (uint64_t)cols)
                    abort();
                sum += c;
                partial++;
            } else {
                abort();
            }
        }
    }
    if (sum != stof_mask_count(m) || full != f->n_full ||
        partial != f->n_partial)
        abort();
    /* Row-wise: ascending keys, bitmaps holding every allowed element. */
    uint64_t rsum = 0;
    for (int i = 0; i < nrb; i++) {
        int64_t nk = f->rw_ptr[i + 1] - f->rw_ptr[i];
        if (nk < 0 || nk > sk || f->rw_words[i] != (nk + 31) / 32)
            abort();
        for (int64_t t = f->rw_ptr[i]; t < f->rw_ptr[i + 1]; t++)
            if (f->rw_keys[t] < 0 || f->rw_keys[t] >= sk ||
                (t > f->rw_ptr[i] && f->rw_keys[t] <= f->rw_keys[t - 1]))
                abort();
        if (f->rw_bitmap_off[i + 1] - f->rw_bitmap_off[i] !=
            (int64_t)bm * f->rw_words[i])
            abort();
        for (int64_t w = f->rw_bitmap_off[i]; w < f->rw_bitmap_off[i + 1]; w++)
            rsum += (uint64_t)popcount32(f->rw_bitmaps[w]);
    }
    if (rsum != stof_mask_count(m))
        abort();
    stof_format_free(&f);
    if (f)
        abort();
}

/* Check a mask's own consistency and its formats. */
static void check_mask(stof_context *ctx, const stof_mask *m)
{
    const int sq = stof_mask_seq_q(m), sk = stof_mask_seq_k(m);
    uint8_t *d = malloc((size_t)sq * (size_t)sk);
    if (!d)
        abort();
    stof_mask_to_dense(m, d);
    uint64_t c = 0;
    for (size_t i = 0; i < (size_t)sq * (size_t)sk; i++) {
        if (d[i] > 1)
            abort();
        c += d[i];
    }
    if (c != stof_mask_count(m))
        abort();
    /* The same bits through from_dense give the same digest. */
    stof_mask *again = NULL;
    if (stof_mask_from_dense(ctx, d, sq, sk, &again) != STOF_OK)
        abort();
    uint64_t a[2], b[2];
    char hex[33];
    stof_mask_digest(m, a, hex);
    stof_mask_digest(again, b, NULL);
    if (a[0] != b[0] || a[1] != b[1] || strlen(hex) != 32)
        abort();
    stof_mask_free(&again);
    free(d);
    check_format(ctx, m, 16, 32);
    check_format(ctx, m, 128, 64);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    stof_context *ctx = fuzz_ctx();
    const int sq = 1 + (int)((data[0] | (unsigned)(data[1] & 0x0f) << 8) % 300);
    const int sk = 1 + (int)((data[2] | (unsigned)(data[1] >> 4) << 8) % 300);
    const uint8_t *rest = data + 3;
    const size_t n = size - 3;

    char *spec = malloc(n + 1);
    if (!spec)
        abort();
    memcpy(spec, rest, n);
    spec[n] = '\0';
    stof_mask *m = NULL;
    stof_status st = stof_mask_from_spec(ctx, spec, sq, sk, &m);
    if (st == STOF_OK) {
        if (!m || stof_mask_seq_q(m) != sq || stof_mask_seq_k(m) != sk)
            abort();
        check_mask(ctx, m);
        /* Evaluation is deterministic. */
        stof_mask *m2 = NULL;
        if (stof_mask_from_spec(ctx, spec, sq, sk, &m2) != STOF_OK)
            abort();
        uint64_t a[2], b[2];
        stof_mask_digest(m, a, NULL);
        stof_mask_digest(m2, b, NULL);
        if (a[0] != b[0] || a[1] != b[1])
            abort();
        stof_mask_free(&m2);
        stof_mask_free(&m);
    } else {
        /* A failure leaves no mask and explains itself with a column. */
        if (m || st != STOF_ERR_INVALID_ARGUMENT)
            abort();
        const char *msg = stof_errmsg(ctx);
        if (!msg || strncmp(msg, "spec \"", 6) != 0 || !strstr(msg, "column "))
            abort();
    }
    free(spec);

    /* The same bytes as a dense mask, shaped to fit. */
    if (n > 0) {
        int dk = (size_t)sk < n ? sk : (int)n;
        int dq = (int)(n / (size_t)dk);
        if (dq > sq)
            dq = sq;
        if (stof_mask_from_dense(ctx, rest, dq, dk, &m) != STOF_OK)
            abort();
        check_mask(ctx, m);
        stof_mask_free(&m);
    }
    return 0;
}
