/*
 * family.c - mask families (stof.h): a parsed spec plus per-sequence
 * instance data, checked here; the mask of one sequence; and its formats
 * built tile by tile without a bit matrix.
 *
 * The tile builder is format.c's builder fed by a row source that, for
 * each row block, classifies the columns from the spec's structure alone
 * (stof__spec_eval_classify): spans of 4096 keys first, then single 64-key
 * words. Empty words are never written, full words are filled without
 * evaluating anything, and only words whose class is unknown are evaluated
 * row by row. So a sliding window over 131072 keys costs the band, not the
 * matrix, and the scratch is one row block (block_m rows of words).
 */
#include "format.h"
#include "spec.h"

#include <stdlib.h>
#include <string.h>

#define FAMILY_MAX_OFFSET (1 << 30)
/* Words per span of the coarse classification. */
#define SPAN_WORDS 64

struct stof_mask_family {
    stof_spec *spec;
    char *canonical;
    int n_seq; /* packed (stof__family_packed): the sequences; else 0 */
    int row_one; /* stof__family_row_one: every row is query row 0 */
};

stof_status stof_mask_family_create(stof_context *ctx, const char *spec,
                                    stof_mask_family **fam)
{
    STOF_CHECK_ARG(ctx, fam != NULL, "stof_mask_family_create: fam is NULL");
    *fam = NULL;
    STOF_CHECK_ARG(ctx, spec != NULL,
                   "stof_mask_family_create: spec is NULL");
    stof_mask_family *f = calloc(1, sizeof(*f));
    if (!f)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory making a mask family");
    stof_status st = stof__spec_parse(ctx, spec, &f->spec);
    if (st == STOF_OK) {
        size_t n = stof__spec_canonical(f->spec, NULL, 0);
        f->canonical = malloc(n + 1);
        if (!f->canonical)
            st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                            "out of memory making a mask family");
        else
            stof__spec_canonical(f->spec, f->canonical, n + 1);
    }
    if (st != STOF_OK) {
        stof_mask_family_free(&f);
        return st;
    }
    *fam = f;
    return stof__ok(ctx);
}

void stof_mask_family_free(stof_mask_family **fam)
{
    if (!fam || !*fam)
        return;
    stof__spec_free(&(*fam)->spec);
    free((*fam)->canonical);
    free(*fam);
    *fam = NULL;
}

const stof_spec *stof__family_spec(const stof_mask_family *fam)
{
    return fam->spec;
}

stof_status stof__family_packed(stof_context *ctx, const stof_mask_family *fam,
                                int n_seq, stof_mask_family **out)
{
    stof_status st = stof_mask_family_create(ctx, fam->canonical, out);
    if (st == STOF_OK)
        (*out)->n_seq = n_seq;
    return st;
}

int stof__family_n_seq(const stof_mask_family *fam)
{
    return fam ? fam->n_seq : 0;
}

stof_status stof__family_row_one(stof_context *ctx,
                                 const stof_mask_family *fam,
                                 stof_mask_family **out)
{
    stof_status st = stof_mask_family_create(ctx, fam->canonical, out);
    if (st == STOF_OK)
        (*out)->row_one = 1;
    return st;
}

int stof__family_rows_one(const stof_mask_family *fam)
{
    return fam ? fam->row_one : 0;
}

const char *stof_mask_family_spec(const stof_mask_family *fam)
{
    return fam ? fam->canonical : "";
}

/* ------------------------------------------------------------------------ */
/* Instance data                                                             */
/* ------------------------------------------------------------------------ */

/* One sequence's values, checked: lengths, and the instance of spec.h. */
typedef struct seq_data {
    int q_len, k_len;
    stof_spec_inst inst;
} seq_data;

static stof_status data_fields(stof_context *ctx, const char *fn, int seq_q,
                               int seq_k, const stof_mask_data *d)
{
    STOF_CHECK_ARG(ctx, seq_q >= 0 && seq_q <= STOF_SPEC_MAX_SEQ,
                   "%s: seq_q = %d, expected 0..%d", fn, seq_q,
                   STOF_SPEC_MAX_SEQ);
    STOF_CHECK_ARG(ctx, seq_k >= 0 && seq_k <= STOF_SPEC_MAX_SEQ,
                   "%s: seq_k = %d, expected 0..%d", fn, seq_k,
                   STOF_SPEC_MAX_SEQ);
    if (!d)
        return STOF_OK;
    for (size_t i = 0; i < sizeof(d->reserved); i++)
        STOF_CHECK_ARG(ctx, d->reserved[i] == 0,
                       "%s: stof_mask_data.reserved[%zu] is not zero "
                       "(zero-initialise the struct)",
                       fn, i);
    STOF_CHECK_ARG(ctx, d->doc_stride == 0 || d->doc_stride >= seq_k,
                   "%s: doc_stride = %lld is below seq_k = %d", fn,
                   (long long)d->doc_stride, seq_k);
    STOF_CHECK_ARG(ctx, d->cu_seqlens_q || !d->cu_seqlens_k,
                   "%s: cu_seqlens_k is set without cu_seqlens_q", fn);
    STOF_CHECK_ARG(ctx, !d->cu_seqlens_q || (!d->q_len && !d->k_len),
                   "%s: packed data (cu_seqlens_q) takes its lengths from "
                   "the offsets: leave q_len and k_len NULL",
                   fn);
    STOF_CHECK_ARG(ctx, d->total_q >= 0 && d->total_k >= 0,
                   "%s: total_q = %d, total_k = %d: expected >= 0", fn,
                   (int)d->total_q, (int)d->total_k);
    const int64_t need = ((int64_t)seq_k + 31) / 32;
    STOF_CHECK_ARG(ctx, d->bitmap_words == 0 || d->bitmap_words >= need,
                   "%s: bitmap_words = %d is below ceil(seq_k / 32) = %lld",
                   fn, (int)d->bitmap_words, (long long)need);
    const int64_t bw = d->bitmap_words ? d->bitmap_words : need;
    /* (Packed: against each sequence's rows, in seq_values.) */
    STOF_CHECK_ARG(ctx,
                   d->bitmap_stride == 0 || d->cu_seqlens_q ||
                       (d->bitmap_stride >= (int64_t)seq_q * bw),
                   "%s: bitmap_stride = %lld is below seq_q x bitmap_words "
                   "= %lld (0 shares one bitmap)",
                   fn, (long long)d->bitmap_stride, (long long)seq_q * bw);
    return STOF_OK;
}

/* Sequence b's offsets [*lo, *hi) in cu (packed data), checked. */
static stof_status packed_range(stof_context *ctx, const char *fn,
                                const char *name, const int32_t *cu, int b,
                                int *lo, int *hi)
{
    STOF_CHECK_ARG(ctx, cu[b] >= 0, "%s: %s[%d] = %d is negative", fn, name,
                   b, (int)cu[b]);
    STOF_CHECK_ARG(ctx, cu[b + 1] >= cu[b],
                   "%s: %s decreases at %d (%d after %d); the offsets must "
                   "be non-decreasing",
                   fn, name, b + 1, (int)cu[b + 1], (int)cu[b]);
    *lo = cu[b];
    *hi = cu[b + 1];
    return STOF_OK;
}

static stof_status seq_values(stof_context *ctx, const char *fn, int seq_q,
                              int seq_k, const stof_mask_data *d, int b,
                              seq_data *out)
{
    memset(out, 0, sizeof(*out));
    out->q_len = seq_q;
    out->k_len = seq_k;
    if (!d)
        return STOF_OK;
    int k_base = 0; /* packed: the sequence's first key */
    if (d->cu_seqlens_q) {
        const int32_t *cuk = d->cu_seqlens_k ? d->cu_seqlens_k
                                             : d->cu_seqlens_q;
        int q0 = 0, q1 = 0, k1 = 0;
        stof_status st = packed_range(ctx, fn, "cu_seqlens_q",
                                      d->cu_seqlens_q, b, &q0, &q1);
        if (st == STOF_OK)
            st = packed_range(ctx, fn,
                              d->cu_seqlens_k ? "cu_seqlens_k"
                                              : "cu_seqlens_q",
                              cuk, b, &k_base, &k1);
        if (st != STOF_OK)
            return st;
        STOF_CHECK_ARG(ctx, q1 - q0 <= seq_q && k1 - k_base <= seq_k,
                       "%s: packed sequence %d is %d x %d, larger than "
                       "%d x %d",
                       fn, b, q1 - q0, k1 - k_base, seq_q, seq_k);
        out->q_len = q1 - q0;
        out->k_len = k1 - k_base;
    }
    if (d->q_len) {
        int v = d->q_len[b];
        STOF_CHECK_ARG(ctx, v >= 0 && v <= seq_q,
                       "%s: q_len[%d] = %d, expected 0..seq_q (%d)", fn, b, v,
                       seq_q);
        out->q_len = v;
    }
    if (d->k_len) {
        int v = d->k_len[b];
        STOF_CHECK_ARG(ctx, v >= 0 && v <= seq_k,
                       "%s: k_len[%d] = %d, expected 0..seq_k (%d)", fn, b, v,
                       seq_k);
        out->k_len = v;
    }
    if (d->q_offset) {
        int v = d->q_offset[b];
        STOF_CHECK_ARG(ctx, v >= 0 && v <= FAMILY_MAX_OFFSET,
                       "%s: q_offset[%d] = %d, expected 0..%d", fn, b, v,
                       FAMILY_MAX_OFFSET);
        out->inst.q_offset = v;
    }
    if (d->prefix) {
        int v = d->prefix[b];
        STOF_CHECK_ARG(ctx, v >= 0, "%s: prefix[%d] = %d is negative", fn, b,
                       v);
        out->inst.prefix = v;
    }
    if (d->seed)
        out->inst.seed = d->seed[b];
    STOF_CHECK_ARG(ctx, d->head >= 0, "%s: head = %d is negative", fn,
                   (int)d->head);
    if (d->head_window) {
        const int v = d->head_window[d->head];
        STOF_CHECK_ARG(ctx, v >= 0, "%s: head_window[%d] = %d is negative",
                       fn, (int)d->head, v);
        out->inst.window = v;
        out->inst.has_window = 1;
    }
    if (d->bitmap) {
        out->inst.bitmap_words =
            d->bitmap_words ? d->bitmap_words : ((int64_t)seq_k + 31) / 32;
        STOF_CHECK_ARG(ctx,
                       d->bitmap_stride == 0 ||
                           d->bitmap_stride >=
                               (int64_t)out->q_len * out->inst.bitmap_words,
                       "%s: bitmap_stride = %lld is below the %d rows x %lld "
                       "words of sequence %d",
                       fn, (long long)d->bitmap_stride, out->q_len,
                       (long long)out->inst.bitmap_words, b);
        out->inst.bitmap = d->bitmap + (int64_t)b * d->bitmap_stride;
    }
    if (d->doc_id) {
        const int64_t stride = d->doc_stride ? d->doc_stride : seq_k;
        const int32_t *doc = d->cu_seqlens_q
                                 ? d->doc_id + k_base
                                 : d->doc_id + (int64_t)b * stride;
        for (int k = 1; k < out->k_len; k++)
            STOF_CHECK_ARG(ctx, doc[k] >= doc[k - 1],
                           "%s: doc_id of sequence %d decreases at key %d "
                           "(%d after %d); document ids must be "
                           "non-decreasing",
                           fn, b, k, (int)doc[k], (int)doc[k - 1]);
        out->inst.doc = doc;
    }
    return STOF_OK;
}

stof_status stof_mask_data_check(stof_context *ctx,
                                 const stof_mask_family *fam, int batch,
                                 int seq_q, int seq_k,
                                 const stof_mask_data *data)
{
    static const char fn[] = "stof_mask_data_check";
    STOF_CHECK_ARG(ctx, fam != NULL, "%s: fam is NULL", fn);
    STOF_CHECK_ARG(ctx, batch >= 1, "%s: batch = %d, expected >= 1", fn,
                   batch);
    stof_status st = data_fields(ctx, fn, seq_q, seq_k, data);
    for (int b = 0; b < batch && st == STOF_OK; b++) {
        seq_data sd;
        st = seq_values(ctx, fn, seq_q, seq_k, data, b, &sd);
    }
    if (st == STOF_OK && data && data->cu_seqlens_q) {
        /* Packed: seq_q and seq_k are the most rows; the last offsets
         * must fit them (and the totals of a run, when given). */
        const int32_t *cuk = data->cu_seqlens_k ? data->cu_seqlens_k
                                                : data->cu_seqlens_q;
        const int tq = data->total_q ? data->total_q : seq_q;
        const int tk = data->total_k ? data->total_k : seq_k;
        STOF_CHECK_ARG(ctx, data->total_q <= seq_q && data->total_k <= seq_k,
                       "%s: total_q = %d, total_k = %d exceed the %d x %d "
                       "rows",
                       fn, (int)data->total_q, (int)data->total_k, seq_q,
                       seq_k);
        STOF_CHECK_ARG(ctx, data->cu_seqlens_q[batch] <= tq,
                       "%s: cu_seqlens_q[%d] = %d is past the %d query rows",
                       fn, batch, (int)data->cu_seqlens_q[batch], tq);
        STOF_CHECK_ARG(ctx, cuk[batch] <= tk,
                       "%s: cu_seqlens_k[%d] = %d is past the %d key rows", fn,
                       batch, (int)cuk[batch], tk);
    }
    return st == STOF_OK ? stof__ok(ctx) : st;
}

/* ------------------------------------------------------------------------ */
/* One sequence's mask                                                       */
/* ------------------------------------------------------------------------ */

/* Check the sizes and sequence b's data of a public call. */
static stof_status seq_args(stof_context *ctx, const char *fn,
                            const stof_mask_family *fam, int seq_q, int seq_k,
                            const stof_mask_data *data, int b, seq_data *sd)
{
    STOF_CHECK_ARG(ctx, fam != NULL, "%s: fam is NULL", fn);
    STOF_CHECK_ARG(ctx, seq_q >= 1 && seq_k >= 1,
                   "%s: the mask is %d x %d; both sizes must be at least 1",
                   fn, seq_q, seq_k);
    STOF_CHECK_ARG(ctx, b >= 0, "%s: b = %d is negative", fn, b);
    stof_status st = data_fields(ctx, fn, seq_q, seq_k, data);
    if (st == STOF_OK)
        st = seq_values(ctx, fn, seq_q, seq_k, data, b, sd);
    return st;
}

stof_status stof_mask_family_eval(stof_context *ctx,
                                  const stof_mask_family *fam, int seq_q,
                                  int seq_k, const stof_mask_data *data, int b,
                                  stof_mask **mask)
{
    static const char fn[] = "stof_mask_family_eval";
    STOF_CHECK_ARG(ctx, mask != NULL, "%s: mask is NULL", fn);
    *mask = NULL;
    seq_data sd;
    stof_status st = seq_args(ctx, fn, fam, seq_q, seq_k, data, b, &sd);
    if (st != STOF_OK)
        return st;
    stof_mask *m = NULL;
    stof_spec_eval *e = NULL;
    st = stof__mask_alloc(ctx, seq_q, seq_k, &m);
    if (st == STOF_OK && sd.q_len > 0 && sd.k_len > 0) {
        /* The instance is q_len x k_len; the rest stays 0. */
        st = stof__spec_eval_new(ctx, fam->spec, sd.q_len, sd.k_len, &sd.inst,
                                 &e);
        const int nw = (sd.k_len + 63) / 64;
        for (int64_t q = 0; st == STOF_OK && q < sd.q_len; q++)
            stof__spec_eval_words(e, q, 0, nw,
                                  m->bits + q * m->words_per_row);
        stof__mask_recount(m);
    }
    stof__spec_eval_free(&e);
    if (st != STOF_OK) {
        stof_mask_free(&m);
        return st;
    }
    *mask = m;
    return stof__ok(ctx);
}

/* ------------------------------------------------------------------------ */
/* Formats tile by tile                                                      */
/* ------------------------------------------------------------------------ */

typedef struct fam_source {
    stof_spec_eval *e;  /* the q_len x k_len instance; NULL if empty */
    int q_len, k_len;
    int wpr;            /* words per row of the seq_k-wide rows */
    int kw;             /* words holding keys below k_len */
    uint64_t last_mask; /* valid bits of word kw - 1 */
    uint64_t *rows;     /* block_m x wpr words, 0 outside the listed words */
    int32_t *act;       /* the words listed for the current block */
    int n_act;
    int rows_used;      /* rows written in the current block */
} fam_source;

/* The valid bits of word w of a row. */
static uint64_t word_mask(const fam_source *s, int w)
{
    return w == s->kw - 1 ? s->last_mask : ~0ull;
}

/* Fill words [w0, w1) of the block's rows that the classification leaves
 * unknown, row by row. */
static void eval_run(fam_source *s, int r0, int rows, int w0, int w1)
{
    for (int r = 0; r < rows; r++)
        stof__spec_eval_words(s->e, r0 + r, w0, w1 - w0,
                              s->rows + (size_t)r * (size_t)s->wpr + w0);
}

static void fill_full(fam_source *s, int rows, int w)
{
    const uint64_t v = word_mask(s, w);
    for (int r = 0; r < rows; r++)
        s->rows[(size_t)r * (size_t)s->wpr + w] = v;
}

/* The class of rows r0..r0+rows-1 x words w0..w1-1. */
static int classify_words(fam_source *s, int r0, int rows, int w0, int w1)
{
    int64_t k0 = 64 * (int64_t)w0, k1 = 64 * (int64_t)w1 - 1;
    if (k1 >= s->k_len)
        k1 = s->k_len - 1;
    return stof__spec_eval_classify(s->e, r0, r0 + rows - 1, k0, k1);
}

/* Words [w0, w1) one by one: empty ones skipped, full ones filled, runs of
 * unknown ones evaluated together. */
static void fill_words(fam_source *s, int r0, int rows, int w0, int w1)
{
    int run = -1; /* start of the current run of unknown words */
    for (int w = w0; w <= w1; w++) {
        int c = w < w1 ? classify_words(s, r0, rows, w, w + 1)
                       : STOF_TILE_EMPTY;
        if (c < 0) {
            if (run < 0)
                run = w;
            s->act[s->n_act++] = w;
            continue;
        }
        if (run >= 0) {
            eval_run(s, r0, rows, run, w);
            run = -1;
        }
        if (c == STOF_TILE_FULL) {
            fill_full(s, rows, w);
            s->act[s->n_act++] = w;
        }
    }
}

static stof_status fam_block(void *user, int r0, int rows,
                             const uint64_t **bits, const int32_t **act,
                             int *n_act)
{
    fam_source *s = user;
    /* Clear what the previous block wrote. */
    for (int z = 0; z < s->n_act; z++)
        for (int r = 0; r < s->rows_used; r++)
            s->rows[(size_t)r * (size_t)s->wpr + s->act[z]] = 0;
    s->n_act = 0;
    /* Rows past q_len (and keys past k_len) are padding: left 0. */
    if (rows > s->q_len - r0)
        rows = s->q_len - r0 > 0 ? s->q_len - r0 : 0;
    s->rows_used = rows;
    for (int w0 = 0; rows > 0 && s->e && w0 < s->kw; w0 += SPAN_WORDS) {
        int w1 = w0 + SPAN_WORDS < s->kw ? w0 + SPAN_WORDS : s->kw;
        int c = w1 - w0 > 1 ? classify_words(s, r0, rows, w0, w1) : -1;
        if (c == STOF_TILE_EMPTY)
            continue;
        if (c == STOF_TILE_FULL) {
            for (int w = w0; w < w1; w++) {
                fill_full(s, rows, w);
                s->act[s->n_act++] = w;
            }
            continue;
        }
        fill_words(s, r0, rows, w0, w1);
    }
    *bits = s->rows;
    *act = s->act;
    *n_act = s->n_act;
    return STOF_OK;
}

stof_status stof_format_build_family(stof_context *ctx,
                                     const stof_mask_family *fam, int seq_q,
                                     int seq_k, const stof_mask_data *data,
                                     int b, int block_m, int block_n,
                                     stof_format **fmt)
{
    return stof__format_build_family_parts(
        ctx, fam, seq_q, seq_k, data, b, block_m, block_n,
        STOF__FORMAT_BLOCK | STOF__FORMAT_ROWWISE, fmt);
}

stof_status stof__format_build_family_parts(stof_context *ctx,
                                            const stof_mask_family *fam,
                                            int seq_q, int seq_k,
                                            const stof_mask_data *data, int b,
                                            int block_m, int block_n,
                                            int parts, stof_format **fmt)
{
    static const char fn[] = "stof_format_build_family";
    STOF_CHECK_ARG(ctx, fmt != NULL, "%s: fmt is NULL", fn);
    *fmt = NULL;
    seq_data sd;
    stof_status st = seq_args(ctx, fn, fam, seq_q, seq_k, data, b, &sd);
    if (st != STOF_OK)
        return st;
    STOF_CHECK_ARG(ctx, block_m >= 16 && block_m <= 256 &&
                            (block_m & (block_m - 1)) == 0,
                   "%s: block_m = %d, expected a power of two from 16 to 256",
                   fn, block_m);

    fam_source s;
    memset(&s, 0, sizeof(s));
    s.q_len = sd.q_len;
    s.k_len = sd.k_len;
    s.wpr = (seq_k + 63) / 64;
    s.kw = (sd.k_len + 63) / 64;
    s.last_mask = (sd.k_len % 64) ? (~0ull >> (64 - sd.k_len % 64)) : ~0ull;
    s.rows = calloc((size_t)block_m * (size_t)s.wpr, sizeof(uint64_t));
    s.act = malloc((size_t)s.wpr * sizeof(int32_t));
    if (!s.rows || !s.act)
        st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                        "%s: out of memory for the scratch of a %d x %d "
                        "mask",
                        fn, seq_q, seq_k);
    else if (sd.q_len > 0 && sd.k_len > 0)
        st = stof__spec_eval_new(ctx, fam->spec, sd.q_len, sd.k_len, &sd.inst,
                                 &s.e);
    if (st == STOF_OK) {
        stof_row_source src = {seq_q, seq_k, s.wpr, block_n, fam_block, &s};
        st = stof__format_build_source(ctx, &src, block_m, block_n, parts,
                                       fmt);
    }
    stof__spec_eval_free(&s.e);
    free(s.rows);
    free(s.act);
    return st == STOF_OK ? stof__ok(ctx) : st;
}
