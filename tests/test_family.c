/*
 * test_family.c - mask families (stof.h, "Mask families"):
 *
 * - stof_mask_family_eval against an element oracle written here from the
 *   definitions in stof.h (its own little parser and evaluator, no library
 *   evaluation code), on hand-written and random specs with !, &, | and
 *   parentheses, and random instance data: odd sizes, seq_q != seq_k,
 *   lengths below seq_q/seq_k, query offsets (bottom-right aligned too),
 *   sorted document ids with garbage past k_len, prefixes past the keys;
 * - stof_format_build_family against stof_format_build of the evaluated
 *   mask, bit for bit (every array, every count, both fills), for every
 *   block size pair, on the public suite and family specs (seeded ones with
 *   per-sequence seeds) and random specs and instances;
 * - zero lengths, bad instance data and bad arguments (status and message);
 * - the parser's new forms, canonical texts (a fixed point that keeps the
 *   meaning), its errors, and stof_mask_from_spec with the new forms;
 * - long contexts built without a bit matrix (sliding:4096 at 131072,
 *   causal&docs at 262144) against closed-form counts, within a time limit.
 *
 * Failures name the spec, the sizes, the sequence's data and the replay
 * seed (STOF_TEST_SEED).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention_int.h"
#include "stof.h"
#include "internal.h"
#include "testutil.h"

static stof_context *open_ctx(void)
{
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, NULL), STOF_OK, "%s", stof_errmsg(ctx));
    return ctx;
}

static const int block_sizes[] = {16, 32, 64, 128, 256};
#define N_BLOCK_SIZES 5

static stof_mask_family *fam_make(stof_context *ctx, const char *spec)
{
    stof_mask_family *fam = NULL;
    stof_status st = stof_mask_family_create(ctx, spec, &fam);
    cr_assert_eq(st, STOF_OK, "family \"%s\": %s", spec, stof_errmsg(ctx));
    cr_assert_not_null(fam);
    return fam;
}

/* ------------------------------------------------------------------------ */
/* The oracle: a spec tree, its own parser and printer, and a per-element    */
/* evaluator written from stof.h                                             */
/* ------------------------------------------------------------------------ */

enum { O_LEAF, O_NOT, O_AND, O_OR };
enum {
    L_DENSE, L_NONE, L_CAUSAL, L_SLIDING, L_CSLIDING, L_DILATED,
    L_LONGFORMER, L_STRIDED, L_DOCS, L_PREFIX, L_PREFIXP, L_BIGBIRD,
    L_RANDOM, L_BITMAP, L_HSLIDING, L_HCSLIDING
};

#define MAX_KIDS 4

typedef struct onode {
    int op;
    int kind;            /* leaf */
    long long a, b;      /* W, D/G, S, P, B W */
    long long c, d;      /* bigbird G R */
    unsigned long long seed;
    char prob[40];       /* random's P as written */
    int nk;
    struct onode *k[MAX_KIDS];
} onode;

static onode *onew(int op)
{
    onode *n = calloc(1, sizeof(*n));
    cr_assert_not_null(n);
    n->op = op;
    return n;
}

static void ofree(onode *n)
{
    if (!n)
        return;
    for (int i = 0; i < n->nk; i++)
        ofree(n->k[i]);
    free(n);
}

/* 1 when every leaf is one the oracle knows (not random or bigbird). */
static int oracle_ok(const onode *n)
{
    if (n->op == O_LEAF)
        return n->kind != L_RANDOM && n->kind != L_BIGBIRD;
    for (int i = 0; i < n->nk; i++)
        if (!oracle_ok(n->k[i]))
            return 0;
    return 1;
}

/* One sequence as the oracle sees it. */
typedef struct oseq {
    int q_len, k_len;
    long long q_off, prefix;
    const int32_t *doc; /* NULL: one document */
    const uint32_t *bm; /* `bitmap`: row q's bits at bm + q * bm_words */
    long long bm_words;
    int has_win;        /* head_*: the head's window, or no limit */
    long long win;
} oseq;

static long long llabs_(long long x)
{
    return x < 0 ? -x : x;
}

static int oracle(const onode *n, const oseq *s, long long p, long long k)
{
    switch (n->op) {
    case O_NOT:
        return !oracle(n->k[0], s, p, k);
    case O_AND:
        for (int i = 0; i < n->nk; i++)
            if (!oracle(n->k[i], s, p, k))
                return 0;
        return 1;
    case O_OR:
        for (int i = 0; i < n->nk; i++)
            if (oracle(n->k[i], s, p, k))
                return 1;
        return 0;
    default:
        break;
    }
    const long long d = p - k;
    switch (n->kind) {
    case L_DENSE:
        return 1;
    case L_NONE:
        return 0;
    case L_CAUSAL:
        return k <= p;
    case L_SLIDING:
        return llabs_(d) < n->a;
    case L_CSLIDING:
        return d >= 0 && d < n->a;
    case L_DILATED:
        return llabs_(d) < n->a && d % n->b == 0;
    case L_LONGFORMER:
        return llabs_(d) < n->a || p < n->b || k < n->b;
    case L_STRIDED:
        return llabs_(d) < n->a || k % n->a == n->a - 1;
    case L_DOCS:
        if (p >= s->k_len)
            return 0;
        return !s->doc || s->doc[p] == s->doc[k];
    case L_PREFIX:
        return k < s->prefix;
    case L_PREFIXP:
        return k < n->a;
    case L_HSLIDING:
        return !s->has_win || llabs_(d) < s->win;
    case L_HCSLIDING:
        return d >= 0 && (!s->has_win || d < s->win);
    case L_BITMAP: {
        const long long q = p - s->q_off; /* rows, not positions */
        if (!s->bm)
            return 1;
        return (s->bm[q * s->bm_words + k / 32] >> (k % 32)) & 1u;
    }
    }
    cr_assert_fail("oracle: leaf kind %d has no oracle", n->kind);
    return 0;
}

/* --- A parser of the grammar, written independently of the library. --- */

typedef struct tparse {
    const char *s;
    size_t i;
} tparse;

static void tp_ws(tparse *p)
{
    while (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
           p->s[p->i] == '\r' || p->s[p->i] == '\v' || p->s[p->i] == '\f')
        p->i++;
}

static onode *tp_expr(tparse *p);

static onode *tp_leaf(tparse *p)
{
    char name[32];
    int o = 0;
    while ((p->s[p->i] >= 'a' && p->s[p->i] <= 'z') || p->s[p->i] == '_') {
        cr_assert(o < 31);
        name[o++] = p->s[p->i++];
    }
    name[o] = '\0';
    char par[5][40];
    int np = 0;
    for (;;) {
        tp_ws(p);
        if (p->s[p->i] != ':')
            break;
        p->i++;
        tp_ws(p);
        int t = 0;
        cr_assert(np < 5, "test parser: too many parameters in %s", p->s);
        while ((p->s[p->i] >= '0' && p->s[p->i] <= '9') || p->s[p->i] == '.') {
            cr_assert(t < 39);
            par[np][t++] = p->s[p->i++];
        }
        par[np][t] = '\0';
        cr_assert(t > 0, "test parser: bad parameter in %s", p->s);
        np++;
    }
    onode *n = onew(O_LEAF);
    static const struct {
        const char *name;
        int kind, np;
    } names[] = {
        {"dense", L_DENSE, 0},        {"none", L_NONE, 0},
        {"causal", L_CAUSAL, 0},      {"sliding", L_SLIDING, 1},
        {"causal_sliding", L_CSLIDING, 1}, {"dilated", L_DILATED, 2},
        {"longformer", L_LONGFORMER, 2}, {"strided", L_STRIDED, 1},
        {"docs", L_DOCS, 0},          {"prefix", L_PREFIX, 0},
        {"prefix", L_PREFIXP, 1},     {"bigbird", L_BIGBIRD, 5},
        {"random", L_RANDOM, 2},      {"bitmap", L_BITMAP, 0},
        {"head_sliding", L_HSLIDING, 0},
        {"head_causal_sliding", L_HCSLIDING, 0},
    };
    int found = 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(names[i].name, name) && names[i].np == np) {
            n->kind = names[i].kind;
            found = 1;
            break;
        }
    cr_assert(found, "test parser: unknown leaf %s/%d in \"%s\"", name, np,
              p->s);
    long long v[5] = {0};
    for (int i = 0; i < np; i++)
        v[i] = strtoll(par[i], NULL, 10);
    n->a = v[0];
    n->b = v[1];
    n->c = v[2];
    n->d = v[3];
    if (n->kind == L_BIGBIRD)
        n->seed = strtoull(par[4], NULL, 10);
    if (n->kind == L_RANDOM) {
        snprintf(n->prob, sizeof(n->prob), "%s", par[0]);
        n->seed = strtoull(par[1], NULL, 10);
    }
    return n;
}

static onode *tp_factor(tparse *p)
{
    tp_ws(p);
    if (p->s[p->i] == '!') {
        p->i++;
        onode *n = onew(O_NOT);
        n->k[n->nk++] = tp_factor(p);
        return n;
    }
    if (p->s[p->i] == '(') {
        p->i++;
        onode *n = tp_expr(p);
        tp_ws(p);
        cr_assert_eq(p->s[p->i], ')', "test parser: ')' expected in \"%s\"",
                     p->s);
        p->i++;
        return n;
    }
    return tp_leaf(p);
}

/* Operand lists are folded into binary nodes (meaning is the same). */
static onode *tp_list(tparse *p, char sep, int op, onode *(*sub)(tparse *))
{
    onode *n = sub(p);
    for (;;) {
        tp_ws(p);
        if (p->s[p->i] != sep)
            return n;
        p->i++;
        onode *m = onew(op);
        m->k[m->nk++] = n;
        m->k[m->nk++] = sub(p);
        n = m;
    }
}

static onode *tp_term(tparse *p)
{
    return tp_list(p, '&', O_AND, tp_factor);
}

static onode *tp_expr(tparse *p)
{
    return tp_list(p, '|', O_OR, tp_term);
}

static onode *tparse_spec(const char *s)
{
    tparse p = {s, 0};
    onode *n = tp_expr(&p);
    tp_ws(&p);
    cr_assert_eq(p.s[p.i], '\0', "test parser: trailing text in \"%s\"", s);
    return n;
}

/* --- Random trees and their text. --- */

typedef struct sbuf {
    char b[8192];
    size_t n;
} sbuf;

static void sb_put(sbuf *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(s->b + s->n, sizeof(s->b) - s->n, fmt, ap);
    va_end(ap);
    cr_assert(k >= 0 && s->n + (size_t)k < sizeof(s->b), "spec too long");
    s->n += (size_t)k;
}

/* Random whitespace between tokens when `ws`. */
static void sb_ws(sbuf *s, tu_rng *r, int ws)
{
    if (ws && tu_below(r, 4) == 0)
        sb_put(s, "%s", tu_below(r, 3) ? " " : " \t ");
}

static long long pick(tu_rng *r, const long long *v, int n)
{
    return v[tu_below(r, (uint64_t)n)];
}

#define PICK(r, arr) pick(r, arr, (int)(sizeof(arr) / sizeof(arr[0])))

static onode *rand_leaf(tu_rng *r, int any)
{
    static const long long ws[] = {1,  2,  3,   7,   16,  33,
                                   64, 65, 100, 128, 250, 256, 1000};
    static const long long ds[] = {1, 2, 3, 5, 64, 65, 130};
    static const long long gs[] = {0, 1, 3, 40, 64, 70, 128, 200};
    static const long long ss[] = {1, 2, 3, 16, 64, 67, 128, 200};
    static const long long ps[] = {0, 1, 5, 63, 64, 65, 128, 130, 256, 400};
    static const char *probs[] = {"0", "0.05", "0.3", "0.5", "0.7", "0.97",
                                  "1", ".25"};
    onode *n = onew(O_LEAF);
    /* The common family leaves come more often. */
    static const int kinds[] = {L_DENSE,   L_NONE,     L_CAUSAL,  L_CAUSAL,
                                L_SLIDING, L_CSLIDING, L_DILATED, L_LONGFORMER,
                                L_STRIDED, L_DOCS,     L_DOCS,    L_PREFIX,
                                L_PREFIXP, L_BITMAP,   L_HSLIDING,
                                L_HCSLIDING, L_BIGBIRD, L_RANDOM};
    int nkinds = (int)(sizeof(kinds) / sizeof(kinds[0]));
    if (!any)
        nkinds -= 2;
    n->kind = kinds[tu_below(r, (uint64_t)nkinds)];
    switch (n->kind) {
    case L_SLIDING:
    case L_CSLIDING:
        n->a = PICK(r, ws);
        break;
    case L_DILATED:
        n->a = PICK(r, ws);
        n->b = PICK(r, ds);
        break;
    case L_LONGFORMER:
        n->a = PICK(r, ws);
        n->b = PICK(r, gs);
        break;
    case L_STRIDED:
        n->a = PICK(r, ss);
        break;
    case L_PREFIXP:
        n->a = PICK(r, ps);
        break;
    case L_BIGBIRD: {
        static const long long bs[] = {16, 17, 64}, bw[] = {1, 2, 3},
                               bg[] = {0, 1}, br[] = {0, 1, 2, 5};
        n->a = PICK(r, bs);
        n->b = PICK(r, bw);
        n->c = PICK(r, bg);
        n->d = PICK(r, br);
        n->seed = tu_next(r);
        break;
    }
    case L_RANDOM:
        snprintf(n->prob, sizeof(n->prob), "%s",
                 probs[tu_below(r, sizeof(probs) / sizeof(probs[0]))]);
        n->seed = tu_next(r);
        break;
    default:
        break;
    }
    return n;
}

static onode *rand_tree(tu_rng *r, int depth, int any)
{
    if (depth == 0 || tu_below(r, 10) < 3)
        return rand_leaf(r, any);
    int c = (int)tu_below(r, 8);
    if (c < 2) {
        onode *n = onew(O_NOT);
        n->k[n->nk++] = rand_tree(r, depth - 1, any);
        return n;
    }
    onode *n = onew(c < 5 ? O_AND : O_OR);
    int nk = 2 + (int)tu_below(r, 2);
    for (int i = 0; i < nk; i++)
        n->k[n->nk++] = rand_tree(r, depth - 1, any);
    return n;
}

static void print_leaf(sbuf *s, const onode *n, tu_rng *r, int ws)
{
    static const char *names[] = {"dense",   "none",           "causal",
                                  "sliding", "causal_sliding", "dilated",
                                  "longformer", "strided",     "docs",
                                  "prefix",  "prefix",         "bigbird",
                                  "random",  "bitmap", "head_sliding",
                                  "head_causal_sliding"};
    sb_put(s, "%s", names[n->kind]);
#define PARAM(fmt, v)                                                          \
    do {                                                                       \
        sb_ws(s, r, ws);                                                       \
        sb_put(s, ":");                                                        \
        sb_ws(s, r, ws);                                                       \
        sb_put(s, fmt, v);                                                     \
    } while (0)
    switch (n->kind) {
    case L_SLIDING:
    case L_CSLIDING:
    case L_STRIDED:
    case L_PREFIXP:
        PARAM("%lld", n->a);
        break;
    case L_DILATED:
    case L_LONGFORMER:
        PARAM("%lld", n->a);
        PARAM("%lld", n->b);
        break;
    case L_BIGBIRD:
        PARAM("%lld", n->a);
        PARAM("%lld", n->b);
        PARAM("%lld", n->c);
        PARAM("%lld", n->d);
        PARAM("%llu", n->seed);
        break;
    case L_RANDOM:
        PARAM("%s", n->prob);
        PARAM("%llu", n->seed);
        break;
    default:
        break;
    }
#undef PARAM
}

/* The text of a tree: parentheses where the grammar needs them, and at
 * random elsewhere. */
static void print_tree(sbuf *s, const onode *n, tu_rng *r, int ws)
{
    const int extra = tu_below(r, 7) == 0;
    sb_ws(s, r, ws);
    if (extra)
        sb_put(s, "(");
    switch (n->op) {
    case O_LEAF:
        print_leaf(s, n, r, ws);
        break;
    case O_NOT: {
        const onode *k = n->k[0];
        int paren = k->op == O_AND || k->op == O_OR;
        sb_put(s, "!");
        sb_ws(s, r, ws);
        if (paren)
            sb_put(s, "(");
        print_tree(s, k, r, ws);
        if (paren)
            sb_put(s, ")");
        break;
    }
    case O_AND:
    case O_OR:
        for (int i = 0; i < n->nk; i++) {
            const onode *k = n->k[i];
            int paren = (n->op == O_AND && k->op == O_OR) ||
                        (k->op == n->op && tu_below(r, 2));
            if (i) {
                sb_ws(s, r, ws);
                sb_put(s, n->op == O_AND ? "&" : "|");
            }
            sb_ws(s, r, ws);
            if (paren)
                sb_put(s, "(");
            print_tree(s, k, r, ws);
            if (paren)
                sb_put(s, ")");
        }
        break;
    }
    if (extra)
        sb_put(s, ")");
    sb_ws(s, r, ws);
}

/* ------------------------------------------------------------------------ */
/* Random instance data                                                      */
/* ------------------------------------------------------------------------ */

#define MAX_BATCH 3

typedef struct inst {
    int sq, sk, batch;
    uint64_t made_from; /* the generator state it was made from */
    int32_t q_len[MAX_BATCH], k_len[MAX_BATCH], q_off[MAX_BATCH],
        prefix[MAX_BATCH];
    uint64_t seed[MAX_BATCH];
    int32_t *doc;
    int64_t stride; /* the stride actually used */
    int32_t hw[3];  /* head_window of three heads, d.head one of them */
    uint32_t *bm;   /* `bitmap`: sequence b's at bm + b * bm_stride */
    int64_t bm_stride, bm_words; /* as used (0 shared / the default) */
    stof_mask_data d;
} inst;

static int rand_len(tu_rng *r, int max)
{
    if (tu_below(r, 16) == 0)
        return 0; /* an empty sequence */
    switch (tu_below(r, 4)) {
    case 0:
    case 1:
        return max;
    case 2:
        return 1 + (int)tu_below(r, (uint64_t)max);
    default:
        return max > 3 ? max - (int)tu_below(r, 3) : max;
    }
}

/* Fill the documents of key positions 0..k_len-1 (sorted, documents of
 * 1..maxdoc tokens) and garbage from k_len to `to`. */
static void rand_docs(tu_rng *r, int32_t *doc, int k_len, int64_t to)
{
    const int maxdoc = tu_below(r, 3) == 0 ? 5 : 50;
    int32_t id = (int32_t)tu_below(r, 2001) - 1000;
    if (tu_below(r, 8) == 0)
        id = INT32_MIN + (int32_t)tu_below(r, 10);
    int k = 0;
    while (k < k_len) {
        int len = 1 + (int)tu_below(r, (uint64_t)maxdoc);
        for (int t = 0; t < len && k < k_len; t++)
            doc[k++] = id;
        id += 1 + (int32_t)tu_below(r, tu_below(r, 10) == 0 ? 100000 : 3);
    }
    for (int64_t g = k_len; g < to; g++)
        doc[g] = (int32_t)tu_next(r); /* past the keys: not looked at */
}

static void inst_free(inst *in)
{
    free(in->doc);
    in->doc = NULL;
    free(in->bm);
    in->bm = NULL;
}

/* Random data for batch sequences of at most sq x sk; every field set with
 * some probability (left out: the default). */
static void inst_rand(inst *in, tu_rng *r, int sq, int sk, int batch)
{
    memset(in, 0, sizeof(*in));
    in->made_from = r->s;
    in->sq = sq;
    in->sk = sk;
    in->batch = batch;
    const int has_ql = tu_below(r, 10) < 7, has_kl = tu_below(r, 10) < 7,
              has_off = tu_below(r, 10) < 7, has_pre = tu_below(r, 10) < 7,
              has_doc = tu_below(r, 10) < 7, has_seed = tu_below(r, 2),
              has_bm = tu_below(r, 10) < 7, has_hw = tu_below(r, 10) < 7;
    if (has_hw) {
        static const int32_t wins[] = {0, 1, 2, 7, 64, 65, 130, 1000};
        for (int h = 0; h < 3; h++)
            in->hw[h] = wins[tu_below(r, 8)];
        in->d.head_window = in->hw;
        in->d.head = (int32_t)tu_below(r, 3);
    }
    for (int b = 0; b < batch; b++) {
        in->q_len[b] = has_ql ? rand_len(r, sq) : sq;
        in->k_len[b] = has_kl ? rand_len(r, sk) : sk;
        int ql = in->q_len[b], kl = in->k_len[b];
        int off = 0;
        switch (tu_below(r, 6)) {
        case 0:
            off = 0;
            break;
        case 1:
        case 2:
            off = kl >= ql ? kl - ql : (int)tu_below(r, (uint64_t)kl + 1);
            break;
        case 3:
            off = (int)tu_below(r, (uint64_t)kl + 50);
            break;
        case 4:
            off = (1 << 29) + (int)tu_below(r, 1000);
            break;
        default:
            off = tu_below(r, 2) ? (1 << 30) : (int)tu_below(r, 3);
            break;
        }
        in->q_off[b] = has_off ? off : 0;
        in->prefix[b] = has_pre ? (int32_t)tu_below(r, (uint64_t)kl + 6) : 0;
        in->seed[b] = has_seed ? (tu_below(r, 5) ? tu_next(r) : 0) : 0;
    }
    if (has_ql)
        in->d.q_len = in->q_len;
    if (has_kl)
        in->d.k_len = in->k_len;
    if (has_off)
        in->d.q_offset = in->q_off;
    if (has_pre)
        in->d.prefix = in->prefix;
    if (has_seed)
        in->d.seed = in->seed;
    if (has_doc) {
        in->d.doc_stride = tu_below(r, 2) ? 0 : sk + (int64_t)tu_below(r, 20);
        in->stride = in->d.doc_stride ? in->d.doc_stride : sk;
        size_t n = (size_t)(in->stride * batch);
        in->doc = malloc((n ? n : 1) * sizeof(int32_t));
        cr_assert_not_null(in->doc);
        for (int b = 0; b < batch; b++)
            rand_docs(r, in->doc + (int64_t)b * in->stride, in->k_len[b],
                      in->stride);
        in->d.doc_id = in->doc;
    }
    if (has_bm) {
        /* Random bits (dense or sparse), shared or one bitmap a sequence,
         * rows of the default or a wider width. */
        const int64_t need = ((int64_t)sk + 31) / 32;
        in->d.bitmap_words = tu_below(r, 2) ? 0 : (int32_t)(need + tu_below(r, 3));
        in->bm_words = in->d.bitmap_words ? in->d.bitmap_words : need;
        const int shared = tu_below(r, 3) == 0;
        in->d.bitmap_stride =
            shared ? 0 : (int64_t)sq * in->bm_words + (int64_t)tu_below(r, 5);
        in->bm_stride = in->d.bitmap_stride;
        const size_t n = (size_t)((shared ? 0 : (batch - 1) * in->bm_stride) +
                                  (int64_t)sq * in->bm_words);
        in->bm = malloc((n ? n : 1) * sizeof(uint32_t));
        cr_assert_not_null(in->bm);
        const int density = (int)tu_below(r, 4); /* of 4 draws ANDed/ORed */
        for (size_t i = 0; i < n; i++) {
            uint32_t x = (uint32_t)tu_next(r);
            if (density == 0)
                x &= (uint32_t)tu_next(r) & (uint32_t)tu_next(r);
            else if (density == 3)
                x |= (uint32_t)tu_next(r);
            in->bm[i] = x;
        }
        in->d.bitmap = in->bm;
    }
}

static oseq inst_seq(const inst *in, int b)
{
    oseq s;
    s.q_len = in->q_len[b];
    s.k_len = in->k_len[b];
    s.q_off = in->q_off[b];
    s.prefix = in->prefix[b];
    s.doc = in->doc ? in->doc + (int64_t)b * in->stride : NULL;
    s.bm = in->bm ? in->bm + (int64_t)b * in->bm_stride : NULL;
    s.bm_words = in->bm_words;
    s.has_win = in->d.head_window != NULL;
    s.win = s.has_win ? in->hw[in->d.head] : 0;
    return s;
}

/* A description of sequence b's data for failure messages. */
static const char *inst_desc(const inst *in, int b, char *buf, size_t n)
{
    snprintf(buf, n,
             "seq %dx%d batch %d b %d: q_len %d%s k_len %d%s q_offset %d%s "
             "prefix %d%s seed %llu%s doc_id %s (stride %lld, first %d), "
             "instance generator state %llu",
             in->sq, in->sk, in->batch, b, in->q_len[b],
             in->d.q_len ? "" : "(default)", in->k_len[b],
             in->d.k_len ? "" : "(default)", in->q_off[b],
             in->d.q_offset ? "" : "(default)", in->prefix[b],
             in->d.prefix ? "" : "(default)",
             (unsigned long long)in->seed[b], in->d.seed ? "" : "(default)",
             in->doc ? "set" : "NULL", (long long)in->d.doc_stride,
             in->doc && in->k_len[b] ? in->doc[(int64_t)b * in->stride] : 0,
             (unsigned long long)in->made_from);
    return buf;
}

/* ------------------------------------------------------------------------ */
/* 1. Eval against the oracle                                               */
/* ------------------------------------------------------------------------ */

/* The mask of sequence b against the oracle, element by element. */
static void check_eval(stof_context *ctx, const stof_mask_family *fam,
                       const char *spec, const onode *tree, const inst *in,
                       int b)
{
    char desc[512];
    const oseq s = inst_seq(in, b);
    stof_mask *m = NULL;
    stof_status st =
        stof_mask_family_eval(ctx, fam, in->sq, in->sk, &in->d, b, &m);
    cr_assert_eq(st, STOF_OK, "\"%s\" %s: %s", spec,
                 inst_desc(in, b, desc, sizeof(desc)), stof_errmsg(ctx));
    /* The mask is seq_q x seq_k; rows past q_len and keys past k_len are
     * padding, never allowed. */
    cr_assert_eq(stof_mask_seq_q(m), in->sq, "\"%s\" %s", spec,
                 inst_desc(in, b, desc, sizeof(desc)));
    cr_assert_eq(stof_mask_seq_k(m), in->sk, "\"%s\" %s", spec,
                 inst_desc(in, b, desc, sizeof(desc)));
    uint64_t count = 0;
    for (int q = 0; q < in->sq; q++) {
        const long long p = (long long)q + s.q_off;
        for (int k = 0; k < in->sk; k++) {
            int want = q < s.q_len && k < s.k_len ? oracle(tree, &s, p, k) : 0;
            int got = stof_mask_get(m, q, k);
            count += (uint64_t)want;
            if (got != want)
                cr_assert_fail("\"%s\" %s: element (q %d, k %d) (position "
                               "%lld) is %d, %s %d",
                               spec, inst_desc(in, b, desc, sizeof(desc)), q,
                               k, p, got,
                               q < s.q_len && k < s.k_len ? "oracle"
                                                          : "padding",
                               want);
        }
    }
    cr_assert_eq(stof_mask_count(m), count, "\"%s\" %s", spec,
                 inst_desc(in, b, desc, sizeof(desc)));
    stof_mask_free(&m);
}

static const char *const oracle_specs[] = {
    "dense", "none", "causal", "sliding:5", "causal_sliding:17",
    "dilated:9:3", "dilated:300:65", "longformer:10:4", "strided:7", "docs",
    "prefix", "prefix:10", "prefix:0", "!causal", "!docs", "!prefix",
    "causal&docs", "causal|prefix", "  causal | prefix ", "causal|prefix:5",
    "!causal&sliding:8", "!(causal|prefix)", "!!causal", "!!!docs",
    "docs&!prefix:10", "(sliding:100&docs)|prefix", "sliding:100&docs",
    "!(sliding:50)&causal", "causal_sliding:64&docs|prefix:3",
    "!docs|strided:16&!causal", "longformer:32:5&!(docs&causal)",
    "dilated:64:2|!dense", "!none&!(!causal)",
    "( ! causal | docs ) & ( prefix | !sliding:3 )",
    "causal&docs&prefix:70|!(none)&dilated:64:2",
    "!(!(causal&docs)|prefix)", "(docs|prefix)&(causal|!sliding:20)",
    "!(causal_sliding:3|strided:5)&(docs|!prefix:64)",
    "causal & docs | prefix & !causal", "docs&docs&!(!docs)",
    "longformer:4:70|causal&!docs", "!(dense)|none",
};

static const int eval_sizes[] = {1, 7, 63, 64, 65, 200, 333};

Test(family, eval_matches_oracle_on_hand_written_specs)
{
    stof_context *ctx = open_ctx();
    tu_rng rng = {tu_seed() ^ 0x1111};
    const int n_specs = (int)(sizeof(oracle_specs) / sizeof(oracle_specs[0]));
    for (int i = 0; i < n_specs; i++) {
        onode *tree = tparse_spec(oracle_specs[i]);
        stof_mask_family *fam = fam_make(ctx, oracle_specs[i]);
        for (int t = 0; t < 30; t++) {
            int sq = eval_sizes[tu_below(&rng, 7)];
            int sk = eval_sizes[tu_below(&rng, 7)];
            if (t == 0)
                sq = sk = 65;
            inst in;
            int batch = 1 + (int)tu_below(&rng, MAX_BATCH);
            inst_rand(&in, &rng, sq, sk, batch);
            cr_assert_eq(stof_mask_data_check(ctx, fam, batch, sq, sk, &in.d),
                         STOF_OK, "%s", stof_errmsg(ctx));
            for (int b = 0; b < batch; b++)
                check_eval(ctx, fam, oracle_specs[i], tree, &in, b);
            inst_free(&in);
        }
        stof_mask_family_free(&fam);
        cr_assert_null(fam);
        ofree(tree);
    }
    stof_close(&ctx);
}

Test(family, eval_matches_oracle_on_random_specs)
{
    stof_context *ctx = open_ctx();
    tu_rng rng = {tu_seed() ^ 0x2222};
    for (int i = 0; i < 1200; i++) {
        onode *tree = rand_tree(&rng, 3, 0);
        sbuf s = {{0}, 0};
        print_tree(&s, tree, &rng, (int)tu_below(&rng, 2));
        stof_mask_family *fam = fam_make(ctx, s.b);
        /* Our parser reads the text back to the same meaning. */
        onode *back = tparse_spec(s.b);
        for (int t = 0; t < 3; t++) {
            int sq = tu_below(&rng, 2) ? eval_sizes[tu_below(&rng, 7)]
                                        : 1 + (int)tu_below(&rng, 200);
            int sk = tu_below(&rng, 2) ? eval_sizes[tu_below(&rng, 7)]
                                        : 1 + (int)tu_below(&rng, 200);
            inst in;
            int batch = 1 + (int)tu_below(&rng, MAX_BATCH);
            inst_rand(&in, &rng, sq, sk, batch);
            for (int b = 0; b < batch; b++) {
                check_eval(ctx, fam, s.b, tree, &in, b);
                if (t == 0)
                    check_eval(ctx, fam, s.b, back, &in, b);
            }
            inst_free(&in);
        }
        ofree(back);
        stof_mask_family_free(&fam);
        ofree(tree);
    }
    stof_close(&ctx);
}

/* Documents of every length 1..50, a document across row block and word
 * borders, and a query chunk at the end of the keys (bottom-right). */
Test(family, eval_docs_and_bottom_right_alignment)
{
    stof_context *ctx = open_ctx();
    const int sk = 333;
    int32_t doc[333];
    int k = 0, id = 7, len = 1;
    while (k < sk) {
        for (int t = 0; t < len && k < sk; t++)
            doc[k++] = id;
        id += 2;
        len = len % 50 + 1;
    }
    const char *specs[] = {"causal&docs", "docs", "causal|prefix",
                           "sliding:9&docs|prefix", "!docs&causal"};
    const int qls[] = {1, 7, 63, 64, 65, 200, 333};
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
        onode *tree = tparse_spec(specs[i]);
        stof_mask_family *fam = fam_make(ctx, specs[i]);
        for (size_t j = 0; j < sizeof(qls) / sizeof(qls[0]); j++) {
            inst in;
            memset(&in, 0, sizeof(in));
            in.sq = 333;
            in.sk = sk;
            in.batch = 1;
            in.q_len[0] = qls[j];
            in.k_len[0] = sk;
            in.q_off[0] = sk - qls[j];
            in.prefix[0] = 40;
            in.stride = sk;
            in.doc = doc; /* the stack array: not freed */
            in.d.q_len = in.q_len;
            in.d.q_offset = in.q_off;
            in.d.prefix = in.prefix;
            in.d.doc_id = doc;
            check_eval(ctx, fam, specs[i], tree, &in, 0);
        }
        stof_mask_family_free(&fam);
        ofree(tree);
    }
    /* Bottom-right causal: the last query row sees every key, row q sees
     * k_len - q_len + q + 1 keys. */
    stof_mask_family *fam = fam_make(ctx, "causal");
    int32_t ql = 5, kl = 300, off = 295;
    stof_mask_data d;
    memset(&d, 0, sizeof(d));
    d.q_len = &ql;
    d.k_len = &kl;
    d.q_offset = &off;
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_family_eval(ctx, fam, 64, 512, &d, 0, &m), STOF_OK,
                 "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_seq_q(m), 64);
    cr_assert_eq(stof_mask_seq_k(m), 512);
    cr_assert_eq(stof_mask_get(m, 5, 0), 0);   /* padding row */
    cr_assert_eq(stof_mask_get(m, 4, 300), 0); /* padding key */
    cr_assert_eq(stof_mask_count(m), 296 + 297 + 298 + 299 + 300);
    cr_assert_eq(stof_mask_get(m, 4, 299), 1);
    cr_assert_eq(stof_mask_get(m, 0, 296), 0);
    stof_mask_free(&m);
    stof_mask_family_free(&fam);
    /* Windows wider than 2^21 still count where the query offset puts the
     * rows 2.5M positions after the keys: every key within 3M, none
     * within 2M (a window clamped to 2^21 saw none in both). */
    const char *wide[2] = {"sliding:3000000", "causal_sliding:3000000"};
    for (int i = 0; i < 2; i++) {
        fam = fam_make(ctx, wide[i]);
        off = 2500000;
        memset(&d, 0, sizeof(d));
        d.q_offset = &off;
        cr_assert_eq(stof_mask_family_eval(ctx, fam, 64, 64, &d, 0, &m),
                     STOF_OK, "%s", stof_errmsg(ctx));
        cr_assert_eq(stof_mask_count(m), 64 * 64, "%s", wide[i]);
        stof_mask_free(&m);
        char spec[64];
        snprintf(spec, sizeof(spec), "%s", stof_mask_family_spec(fam));
        cr_assert_str_eq(spec, wide[i]); /* the numbers as read */
        stof_mask_family_free(&fam);
    }
    fam = fam_make(ctx, "sliding:2000000");
    cr_assert_eq(stof_mask_family_eval(ctx, fam, 64, 64, &d, 0, &m), STOF_OK,
                 "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_count(m), 0);
    stof_mask_free(&m);
    stof_mask_family_free(&fam);
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* 2. Formats tile by tile against formats of the evaluated mask            */
/* ------------------------------------------------------------------------ */

/* The first index where two arrays of n elements of `elem` bytes differ,
 * or -1. */
static int64_t first_diff(const void *a, const void *b, int64_t n, size_t elem)
{
    if (n <= 0)
        return -1;
    if (!memcmp(a, b, (size_t)n * elem))
        return -1;
    for (int64_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * (int64_t)elem,
                   (const char *)b + i * (int64_t)elem, elem))
            return i;
    return -1;
}

static long long elem_val(const void *p, int64_t i, size_t elem, int sign)
{
    const char *c = (const char *)p + i * (int64_t)elem;
    switch (elem) {
    case 1:
        return *(const uint8_t *)c;
    case 4:
        return sign ? (long long)*(const int32_t *)c
                    : (long long)*(const uint32_t *)c;
    default:
        return (long long)*(const int64_t *)c;
    }
}

/* Compare f (family) with g (reference): every field and array. Returns
 * NULL when equal, else a description of the first difference (static). */
static const char *format_diff(const stof_format *f, const stof_format *g)
{
    static char buf[512];
#define SCALAR(field, fmtc, cast)                                              \
    if (f->field != g->field) {                                                \
        snprintf(buf, sizeof(buf), #field " is " fmtc ", reference " fmtc,     \
                 (cast)f->field, (cast)g->field);                              \
        return buf;                                                            \
    }
    SCALAR(seq_q, "%d", int)
    SCALAR(seq_k, "%d", int)
    SCALAR(block_m, "%d", int)
    SCALAR(block_n, "%d", int)
    SCALAR(n_row_blocks, "%d", int)
    SCALAR(n_col_blocks, "%d", int)
    SCALAR(bitmap_words_per_row, "%d", int)
    SCALAR(n_full, "%lld", long long)
    SCALAR(n_partial, "%lld", long long)
    SCALAR(n_empty, "%lld", long long)
    SCALAR(allowed, "%llu", unsigned long long)
    SCALAR(partial_fill, "%.17g", double)
    SCALAR(rowwise_fill, "%.17g", double)
#undef SCALAR
    const int64_t nrb = g->n_row_blocks;
#define ARRAY(field, n, sign)                                                  \
    do {                                                                       \
        if (!f->field || !g->field) {                                          \
            snprintf(buf, sizeof(buf), #field " is NULL (family %p, "          \
                     "reference %p)", (void *)f->field, (void *)g->field);     \
            return buf;                                                        \
        }                                                                      \
        int64_t at_ = first_diff(f->field, g->field, (n), sizeof(*g->field));  \
        if (at_ >= 0) {                                                        \
            snprintf(buf, sizeof(buf),                                         \
                     #field "[%lld] (of %lld) is %lld, reference %lld",        \
                     (long long)at_, (long long)(n),                           \
                     elem_val(f->field, at_, sizeof(*g->field), sign),         \
                     elem_val(g->field, at_, sizeof(*g->field), sign));        \
            return buf;                                                        \
        }                                                                      \
    } while (0)
    ARRAY(row_ptr, nrb + 1, 1);
    const int64_t nt = g->row_ptr[nrb];
    ARRAY(col_idx, nt, 1);
    ARRAY(kind, nt, 0);
    ARRAY(bitmap_idx, nt, 1);
    ARRAY(bitmaps, g->n_partial * g->block_m * g->bitmap_words_per_row, 0);
    ARRAY(rw_ptr, nrb + 1, 1);
    ARRAY(rw_keys, g->rw_ptr[nrb], 1);
    ARRAY(rw_words, nrb, 1);
    ARRAY(rw_bitmap_off, nrb + 1, 1);
    ARRAY(rw_bitmaps, g->rw_bitmap_off[nrb], 0);
#undef ARRAY
    if (memcmp(f->reserved, g->reserved, sizeof(f->reserved))) {
        snprintf(buf, sizeof(buf), "reserved bytes differ");
        return buf;
    }
    return NULL;
}

/* For sequence b: every tiling of stof_format_build_family against
 * stof_format_build of stof_mask_family_eval. Returns the mask's count. */
static uint64_t check_formats(stof_context *ctx, const stof_mask_family *fam,
                              const char *spec, const inst *in, int b)
{
    char desc[512];
    stof_mask *m = NULL;
    stof_status st =
        stof_mask_family_eval(ctx, fam, in->sq, in->sk, &in->d, b, &m);
    cr_assert_eq(st, STOF_OK, "\"%s\" %s: %s", spec,
                 inst_desc(in, b, desc, sizeof(desc)), stof_errmsg(ctx));
    const uint64_t count = stof_mask_count(m);
    for (int i = 0; i < N_BLOCK_SIZES; i++)
        for (int j = 0; j < N_BLOCK_SIZES; j++) {
            const int bm = block_sizes[i], bn = block_sizes[j];
            stof_format *f = NULL, *g = NULL;
            st = stof_format_build_family(ctx, fam, in->sq, in->sk, &in->d, b,
                                          bm, bn, &f);
            cr_assert_eq(st, STOF_OK, "\"%s\" %dx%d %s: %s", spec, bm, bn,
                         inst_desc(in, b, desc, sizeof(desc)),
                         stof_errmsg(ctx));
            st = stof_format_build(ctx, m, bm, bn, &g);
            cr_assert_eq(st, STOF_OK, "%s", stof_errmsg(ctx));
            const char *diff = format_diff(f, g);
            if (diff)
                cr_assert_fail("stof_format_build_family(\"%s\") tiling %dx%d, "
                               "%s: %s",
                               spec, bm, bn,
                               inst_desc(in, b, desc, sizeof(desc)), diff);
            stof_format_free(&f);
            stof_format_free(&g);
        }
    stof_mask_free(&m);
    return count;
}

static const char *const public_suite[] = {
    "dense",          "causal",      "sliding:256",
    "causal_sliding:128", "dilated:64:2", "longformer:64:16",
    "bigbird:64:3:1:2:7", "strided:64",  "random:0.1:3",
};

static const char *const family_specs[] = {
    "causal&docs",       "causal|prefix",      "sliding:100&docs",
    "!causal",           "!(sliding:50)&causal", "docs&!prefix:10",
    "bigbird:64:3:1:2:7&causal|docs&prefix", "random:0.1:3|causal&docs",
    "bigbird:16:2:0:3:11", "random:0.5:99&!docs", "!random:0.97:5",
    "!bigbird:17:1:1:1:3|prefix:30", "prefix:64|causal_sliding:3",
    "docs|prefix:63", "!(prefix:65&docs)", "longformer:64:16&docs",
    "dilated:64:2&!docs", "strided:64|!prefix", "causal&docs&sliding:256",
    "none", "dense&docs", "!dense", "(docs|prefix:128)&!causal_sliding:128",
};

/* The public suite without instance data at the sizes of the public
 * benchmark's shapes scaled down, and with full lengths and offsets. */
Test(family, formats_equal_public_suite)
{
    stof_context *ctx = open_ctx();
    tu_rng rng = {tu_seed() ^ 0x3333};
    const int dims[][2] = {{700, 700}, {513, 700}, {700, 65}, {1, 333}};
    for (size_t i = 0; i < sizeof(public_suite) / sizeof(public_suite[0]);
         i++) {
        stof_mask_family *fam = fam_make(ctx, public_suite[i]);
        for (size_t s = 0; s < sizeof(dims) / sizeof(dims[0]); s++) {
            inst in;
            memset(&in, 0, sizeof(in));
            in.sq = dims[s][0];
            in.sk = dims[s][1];
            in.batch = 1;
            in.q_len[0] = in.sq;
            in.k_len[0] = in.sk;
            check_formats(ctx, fam, public_suite[i], &in, 0);
            /* The same without a data struct (every default). */
            stof_format *f = NULL, *g = NULL;
            cr_assert_eq(stof_format_build_family(ctx, fam, in.sq, in.sk, NULL,
                                                  0, 64, 128, &f),
                         STOF_OK, "%s", stof_errmsg(ctx));
            stof_mask *m = NULL;
            cr_assert_eq(stof_mask_from_spec(ctx, public_suite[i], in.sq,
                                             in.sk, &m),
                         STOF_OK);
            cr_assert_eq(stof_format_build(ctx, m, 64, 128, &g), STOF_OK);
            const char *diff = format_diff(f, g);
            cr_assert_null(diff,
                           "\"%s\" %dx%d (no data) vs stof_mask_from_spec: %s",
                           public_suite[i], in.sq, in.sk, diff);
            stof_format_free(&f);
            stof_format_free(&g);
            stof_mask_free(&m);
        }
        /* Random instances (per-sequence seeds for the seeded leaves). */
        for (int t = 0; t < 6; t++) {
            inst in;
            int sq = 100 + (int)tu_below(&rng, 600);
            int sk = 100 + (int)tu_below(&rng, 600);
            inst_rand(&in, &rng, sq, sk, 2);
            for (int b = 0; b < 2; b++)
                check_formats(ctx, fam, public_suite[i], &in, b);
            inst_free(&in);
        }
        stof_mask_family_free(&fam);
    }
    stof_close(&ctx);
}

Test(family, formats_equal_family_specs)
{
    stof_context *ctx = open_ctx();
    tu_rng rng = {tu_seed() ^ 0x4444};
    for (size_t i = 0; i < sizeof(family_specs) / sizeof(family_specs[0]);
         i++) {
        stof_mask_family *fam = fam_make(ctx, family_specs[i]);
        for (int t = 0; t < 8; t++) {
            inst in;
            int sq = t == 0 ? 700 : 1 + (int)tu_below(&rng, 600);
            int sk = t == 0 ? 700 : 1 + (int)tu_below(&rng, 600);
            inst_rand(&in, &rng, sq, sk, 2);
            /* Always documents and per-sequence seeds on the first. */
            if (t == 0) {
                in.d.seed = in.seed;
                in.seed[0] = 0x1234567ull;
                in.seed[1] = 0x89abcdefull;
                if (!in.doc) {
                    in.stride = sk;
                    in.doc = malloc((size_t)(2 * sk) * sizeof(int32_t));
                    cr_assert_not_null(in.doc);
                    for (int b = 0; b < 2; b++)
                        rand_docs(&rng, in.doc + (int64_t)b * sk, in.k_len[b],
                                  sk);
                    in.d.doc_id = in.doc;
                    in.d.doc_stride = 0;
                }
            }
            for (int b = 0; b < 2; b++)
                check_formats(ctx, fam, family_specs[i], &in, b);
            inst_free(&in);
        }
        stof_mask_family_free(&fam);
    }
    stof_close(&ctx);
}

Test(family, formats_equal_random_specs)
{
    stof_context *ctx = open_ctx();
    tu_rng rng = {tu_seed() ^ 0x5555};
    for (int i = 0; i < 1000; i++) {
        onode *tree = rand_tree(&rng, 3, 1);
        sbuf s = {{0}, 0};
        print_tree(&s, tree, &rng, 0);
        stof_mask_family *fam = fam_make(ctx, s.b);
        inst in;
        int sq = tu_below(&rng, 2) ? eval_sizes[tu_below(&rng, 7)]
                                    : 1 + (int)tu_below(&rng, 520);
        int sk = tu_below(&rng, 2) ? eval_sizes[tu_below(&rng, 7)]
                                    : 1 + (int)tu_below(&rng, 520);
        int batch = 1 + (int)tu_below(&rng, 2);
        inst_rand(&in, &rng, sq, sk, batch);
        for (int b = 0; b < batch; b++) {
            uint64_t count = check_formats(ctx, fam, s.b, &in, b);
            if (oracle_ok(tree)) {
                /* And the count against the oracle's. */
                oseq sq_ = inst_seq(&in, b);
                uint64_t want = 0;
                for (int q = 0; q < sq_.q_len; q++)
                    for (int k = 0; k < sq_.k_len; k++)
                        want += (uint64_t)oracle(tree, &sq_, q + sq_.q_off, k);
                cr_assert_eq(count, want, "\"%s\": count", s.b);
            }
        }
        inst_free(&in);
        stof_mask_family_free(&fam);
        ofree(tree);
    }
    stof_close(&ctx);
}

/* Seeds: none or 0 keeps the spec's SEED (the mask of stof_mask_from_spec);
 * per-sequence seeds give different, reproducible masks. */
Test(family, per_sequence_seeds)
{
    stof_context *ctx = open_ctx();
    const char *specs[] = {"random:0.3:3", "bigbird:16:3:1:2:7"};
    for (size_t i = 0; i < 2; i++) {
        stof_mask_family *fam = fam_make(ctx, specs[i]);
        stof_mask *ref = NULL, *m = NULL;
        cr_assert_eq(stof_mask_from_spec(ctx, specs[i], 200, 300, &ref),
                     STOF_OK);
        uint64_t dref[2], dm[2], d1[2], d2[2];
        stof_mask_digest(ref, dref, NULL);
        cr_assert_eq(stof_mask_family_eval(ctx, fam, 200, 300, NULL, 0, &m),
                     STOF_OK);
        stof_mask_digest(m, dm, NULL);
        cr_assert(dm[0] == dref[0] && dm[1] == dref[1], "%s: no data",
                  specs[i]);
        stof_mask_free(&m);
        uint64_t seeds[3] = {0, 11, 12};
        stof_mask_data d;
        memset(&d, 0, sizeof(d));
        d.seed = seeds;
        cr_assert_eq(stof_mask_family_eval(ctx, fam, 200, 300, &d, 0, &m),
                     STOF_OK);
        stof_mask_digest(m, dm, NULL);
        cr_assert(dm[0] == dref[0] && dm[1] == dref[1], "%s: seed 0",
                  specs[i]);
        stof_mask_free(&m);
        cr_assert_eq(stof_mask_family_eval(ctx, fam, 200, 300, &d, 1, &m),
                     STOF_OK);
        stof_mask_digest(m, d1, NULL);
        stof_mask_free(&m);
        cr_assert_eq(stof_mask_family_eval(ctx, fam, 200, 300, &d, 2, &m),
                     STOF_OK);
        stof_mask_digest(m, d2, NULL);
        stof_mask_free(&m);
        cr_assert(d1[0] != dref[0] || d1[1] != dref[1], "%s: seed 11 ignored",
                  specs[i]);
        cr_assert(d1[0] != d2[0] || d1[1] != d2[1], "%s: seeds 11 and 12 equal",
                  specs[i]);
        cr_assert_eq(stof_mask_family_eval(ctx, fam, 200, 300, &d, 1, &m),
                     STOF_OK);
        stof_mask_digest(m, dm, NULL);
        stof_mask_free(&m);
        cr_assert(dm[0] == d1[0] && dm[1] == d1[1], "%s: not reproducible",
                  specs[i]);
        stof_mask_free(&ref);
        stof_mask_family_free(&fam);
    }
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* 3. Zero lengths                                                           */
/* ------------------------------------------------------------------------ */

static void assert_arrays_present(const stof_format *f, const char *what)
{
    cr_assert(f->row_ptr && f->col_idx && f->kind && f->bitmap_idx &&
                  f->bitmaps && f->rw_ptr && f->rw_keys && f->rw_words &&
                  f->rw_bitmap_off && f->rw_bitmaps,
              "%s: NULL array", what);
}

/* A sequence with q_len or k_len 0 is all padding: a seq_q x seq_k mask with
 * nothing allowed, and formats with every row block and no tile, no key.
 * seq_q or seq_k 0 is refused. */
Test(family, zero_lengths)
{
    stof_context *ctx = open_ctx();
    const char *specs[] = {"dense", "causal", "!causal", "!none", "docs",
                           "causal|prefix", "random:1:1", "bigbird:16:1:1:9:1",
                           "strided:3|!docs", "!prefix"};
    const int sq = 300, sk = 290;
    const int32_t qls[] = {0, 100, 0, 1, 257, 300};
    const int32_t kls[] = {50, 0, 0, 0, 0, 0};
    const int32_t prefix[] = {10, 10, 10, 10, 10, 10};
    const int32_t off[] = {0, 3, 0, 0, 0, 7};
    int32_t doc[290 * 6];
    memset(doc, 0, sizeof(doc));
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
        stof_mask_family *fam = fam_make(ctx, specs[i]);
        stof_mask_data d;
        memset(&d, 0, sizeof(d));
        d.q_len = qls;
        d.k_len = kls;
        d.prefix = prefix;
        d.q_offset = off;
        d.doc_id = doc;
        cr_assert_eq(stof_mask_data_check(ctx, fam, 6, sq, sk, &d), STOF_OK,
                     "%s", stof_errmsg(ctx));
        for (int b = 0; b < 6; b++) {
            stof_mask *m = NULL;
            stof_status st = stof_mask_family_eval(ctx, fam, sq, sk, &d, b, &m);
            cr_assert_eq(st, STOF_OK, "%s b %d: %s", specs[i], b,
                         stof_errmsg(ctx));
            cr_assert_eq(stof_mask_seq_q(m), sq);
            cr_assert_eq(stof_mask_seq_k(m), sk);
            cr_assert_eq(stof_mask_count(m), 0, "%s b %d", specs[i], b);
            for (int a = 0; a < N_BLOCK_SIZES; a++)
                for (int c = 0; c < N_BLOCK_SIZES; c++) {
                    const int bm = block_sizes[a], bn = block_sizes[c];
                    stof_format *f = NULL, *g = NULL;
                    st = stof_format_build_family(ctx, fam, sq, sk, &d, b, bm,
                                                  bn, &f);
                    cr_assert_eq(st, STOF_OK, "%s b %d: %s", specs[i], b,
                                 stof_errmsg(ctx));
                    const int nrb = (sq + bm - 1) / bm;
                    const int ncb = (sk + bn - 1) / bn;
                    cr_assert_eq(f->seq_q, sq);
                    cr_assert_eq(f->seq_k, sk);
                    cr_assert_eq(f->block_m, bm);
                    cr_assert_eq(f->block_n, bn);
                    cr_assert_eq(f->n_row_blocks, nrb, "%s b %d %dx%d",
                                 specs[i], b, bm, bn);
                    cr_assert_eq(f->n_col_blocks, ncb);
                    assert_arrays_present(f, specs[i]);
                    for (int r = 0; r <= nrb; r++) {
                        cr_assert_eq(f->row_ptr[r], 0, "%s b %d", specs[i], b);
                        cr_assert_eq(f->rw_ptr[r], 0, "%s b %d", specs[i], b);
                        cr_assert_eq(f->rw_bitmap_off[r], 0);
                    }
                    for (int r = 0; r < nrb; r++)
                        cr_assert_eq(f->rw_words[r], 0);
                    cr_assert_eq(f->n_full, 0);
                    cr_assert_eq(f->n_partial, 0);
                    cr_assert_eq(f->n_empty, (int64_t)nrb * ncb);
                    cr_assert_eq(f->allowed, 0);
                    cr_assert(f->partial_fill == 0.0 && f->rowwise_fill == 0.0);
                    /* And the formats of the (empty) evaluated mask. */
                    cr_assert_eq(stof_format_build(ctx, m, bm, bn, &g),
                                 STOF_OK);
                    const char *diff = format_diff(f, g);
                    cr_assert_null(diff, "%s b %d %dx%d: %s", specs[i], b, bm,
                                   bn, diff);
                    stof_format_free(&f);
                    stof_format_free(&g);
                }
            stof_mask_free(&m);
        }
        /* seq_q or seq_k 0 is refused, with or without data. */
        const int zs[][2] = {{0, 40}, {40, 0}, {0, 0}};
        for (int z = 0; z < 3; z++) {
            stof_format *f = (stof_format *)(uintptr_t)1;
            stof_status st = stof_format_build_family(ctx, fam, zs[z][0],
                                                      zs[z][1], NULL, 0, 16,
                                                      16, &f);
            cr_assert_eq(st, STOF_ERR_INVALID_ARGUMENT, "%s %dx%d", specs[i],
                         zs[z][0], zs[z][1]);
            cr_assert_null(f);
            cr_assert(strstr(stof_errmsg(ctx), "at least 1"), "%s",
                          stof_errmsg(ctx));
            stof_mask *m = (stof_mask *)(uintptr_t)1;
            st = stof_mask_family_eval(ctx, fam, zs[z][0], zs[z][1], &d, 0, &m);
            cr_assert_eq(st, STOF_ERR_INVALID_ARGUMENT, "%s %dx%d", specs[i],
                         zs[z][0], zs[z][1]);
            cr_assert_null(m);
            cr_assert(strstr(stof_errmsg(ctx), "at least 1"), "%s",
                          stof_errmsg(ctx));
        }
        stof_mask_family_free(&fam);
    }
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* 4. Bad data and arguments                                                 */
/* ------------------------------------------------------------------------ */

/* Every entry point refuses sequence b of d with a message containing
 * `text` (and the sequence before it is fine where b > 0). */
static void expect_bad(stof_context *ctx, const stof_mask_family *fam,
                       int sq, int sk, const stof_mask_data *d, int b,
                       const char *text, const char *what)
{
    stof_status st = stof_mask_data_check(ctx, fam, b + 1, sq, sk, d);
    cr_assert_eq(st, STOF_ERR_INVALID_ARGUMENT, "%s: data_check gave %s", what,
                 stof_status_name(st));
    cr_assert(strstr(stof_errmsg(ctx), text), "%s: \"%s\" not in: %s", what,
              text, stof_errmsg(ctx));
    stof_mask *m = (stof_mask *)(uintptr_t)1;
    st = stof_mask_family_eval(ctx, fam, sq, sk, d, b, &m);
    cr_assert_eq(st, STOF_ERR_INVALID_ARGUMENT, "%s: eval gave %s", what,
                 stof_status_name(st));
    cr_assert_null(m, "%s", what);
    cr_assert(strstr(stof_errmsg(ctx), text), "%s: \"%s\" not in: %s", what,
              text, stof_errmsg(ctx));
    stof_format *f = (stof_format *)(uintptr_t)1;
    st = stof_format_build_family(ctx, fam, sq, sk, d, b, 64, 64, &f);
    cr_assert_eq(st, STOF_ERR_INVALID_ARGUMENT, "%s: build gave %s", what,
                 stof_status_name(st));
    cr_assert_null(f, "%s", what);
    cr_assert(strstr(stof_errmsg(ctx), text), "%s: \"%s\" not in: %s", what,
              text, stof_errmsg(ctx));
    if (b > 0) {
        cr_assert_eq(stof_mask_data_check(ctx, fam, b, sq, sk, d), STOF_OK,
                     "%s: %s", what, stof_errmsg(ctx));
        cr_assert_eq(stof_mask_family_eval(ctx, fam, sq, sk, d, b - 1, &m),
                     STOF_OK, "%s: %s", what, stof_errmsg(ctx));
        stof_mask_free(&m);
    }
}

Test(family, bad_data_names_the_field)
{
    stof_context *ctx = open_ctx();
    stof_mask_family *fam = fam_make(ctx, "causal&docs|prefix");
    const int sq = 100, sk = 120;
    int32_t ql[2] = {100, 100}, kl[2] = {120, 120}, off[2] = {0, 0},
            pre[2] = {0, 0};
    int32_t doc[2 * 130];
    for (int i = 0; i < 2 * 130; i++)
        doc[i] = i / 7;
    stof_mask_data d;
    memset(&d, 0, sizeof(d));
    d.q_len = ql;
    d.k_len = kl;
    d.q_offset = off;
    d.prefix = pre;
    d.doc_id = doc;
    cr_assert_eq(stof_mask_data_check(ctx, fam, 2, sq, sk, &d), STOF_OK, "%s",
                 stof_errmsg(ctx));

    ql[1] = 101;
    expect_bad(ctx, fam, sq, sk, &d, 1, "q_len[1]", "q_len > seq_q");
    ql[1] = -1;
    expect_bad(ctx, fam, sq, sk, &d, 1, "q_len[1]", "negative q_len");
    ql[1] = 100;
    kl[0] = -1;
    expect_bad(ctx, fam, sq, sk, &d, 0, "k_len[0]", "negative k_len");
    kl[0] = 121;
    expect_bad(ctx, fam, sq, sk, &d, 0, "k_len[0]", "k_len > seq_k");
    kl[0] = 120;
    off[1] = -1;
    expect_bad(ctx, fam, sq, sk, &d, 1, "q_offset[1]", "negative q_offset");
    off[1] = (1 << 30) + 1;
    expect_bad(ctx, fam, sq, sk, &d, 1, "q_offset[1]", "q_offset > 2^30");
    off[1] = 1 << 30;
    cr_assert_eq(stof_mask_data_check(ctx, fam, 2, sq, sk, &d), STOF_OK, "%s",
                 stof_errmsg(ctx));
    off[1] = 0;
    pre[1] = -5;
    expect_bad(ctx, fam, sq, sk, &d, 1, "prefix[1]", "negative prefix");
    pre[1] = 0;

    /* Decreasing documents inside the keys; past k_len they are not
     * looked at. */
    doc[120 + 60] = -3;
    expect_bad(ctx, fam, sq, sk, &d, 1, "decreases", "decreasing doc ids");
    expect_bad(ctx, fam, sq, sk, &d, 1,
               "doc_id of sequence 1 decreases at key 60",
               "decreasing doc ids");
    kl[1] = 60;
    cr_assert_eq(stof_mask_data_check(ctx, fam, 2, sq, sk, &d), STOF_OK, "%s",
                 stof_errmsg(ctx));
    kl[1] = 120;
    doc[120 + 60] = doc[120 + 59];
    doc[119] = -1; /* the last key of sequence 0 */
    expect_bad(ctx, fam, sq, sk, &d, 0, "decreases", "last key decreasing");
    doc[119] = 119 / 7;

    /* doc_stride below seq_k (and negative). */
    d.doc_stride = sk - 1;
    expect_bad(ctx, fam, sq, sk, &d, 0, "doc_stride", "doc_stride < seq_k");
    d.doc_stride = -1;
    expect_bad(ctx, fam, sq, sk, &d, 0, "doc_stride", "negative doc_stride");
    d.doc_stride = 130;
    cr_assert_eq(stof_mask_data_check(ctx, fam, 2, sq, sk, &d), STOF_OK, "%s",
                 stof_errmsg(ctx));
    d.doc_stride = 0;

    /* Reserved bytes. */
    for (int i = 0; i < (int)sizeof(d.reserved); i += 13) {
        d.reserved[i] = 1;
        expect_bad(ctx, fam, sq, sk, &d, 0, "reserved", "reserved byte");
        d.reserved[i] = 0;
    }
    d.reserved[sizeof(d.reserved) - 1] = 0x80;
    expect_bad(ctx, fam, sq, sk, &d, 0, "reserved", "the last reserved byte");
    d.reserved[sizeof(d.reserved) - 1] = 0;
    cr_assert_eq(stof_mask_data_check(ctx, fam, 2, sq, sk, &d), STOF_OK, "%s",
                 stof_errmsg(ctx));

    /* Sizes out of range. */
    stof_mask *m = NULL;
    stof_format *f = NULL;
    cr_assert_eq(stof_mask_data_check(ctx, fam, 1, 1048577, 10, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "seq_q"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_family_eval(ctx, fam, 10, 1048577, NULL, 0, &m),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "seq_k"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_format_build_family(ctx, fam, 1048577, 10, NULL, 0, 16,
                                          16, &f),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "seq_q"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_family_eval(ctx, fam, 10, -1, NULL, 0, &m),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "-1"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_format_build_family(ctx, fam, -1, 10, NULL, 0, 16, 16,
                                          &f),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "-1"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_data_check(ctx, fam, 0, 10, 10, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "batch"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_family_eval(ctx, fam, 10, 10, NULL, -1, &m),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "b = -1"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_format_build_family(ctx, fam, 10, 10, NULL, -1, 16, 16,
                                          &f),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_null(m);
    cr_assert_null(f);
    stof_mask_family_free(&fam);
    stof_close(&ctx);
}

Test(family, bad_arguments)
{
    stof_context *ctx = open_ctx();
    stof_mask *m = (stof_mask *)(uintptr_t)1;
    stof_format *f = (stof_format *)(uintptr_t)1;
    /* NULL family. */
    cr_assert_eq(stof_mask_family_eval(ctx, NULL, 8, 8, NULL, 0, &m),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_null(m);
    cr_assert(strstr(stof_errmsg(ctx), "fam is NULL"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_format_build_family(ctx, NULL, 8, 8, NULL, 0, 16, 16,
                                          &f),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_null(f);
    cr_assert(strstr(stof_errmsg(ctx), "fam is NULL"), "%s", stof_errmsg(ctx));
    cr_assert_eq(stof_mask_data_check(ctx, NULL, 1, 8, 8, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "fam is NULL"), "%s", stof_errmsg(ctx));
    cr_assert_str_eq(stof_mask_family_spec(NULL), "");
    stof_mask_family_free(NULL);
    stof_mask_family *fam = NULL;
    stof_mask_family_free(&fam);
    cr_assert_eq(stof_mask_family_create(ctx, NULL, &fam),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_null(fam);
    cr_assert_eq(stof_mask_family_create(ctx, "causal", NULL),
                 STOF_ERR_INVALID_ARGUMENT);

    /* NULL out-pointers. */
    fam = fam_make(ctx, "causal");
    cr_assert_eq(stof_mask_family_eval(ctx, fam, 8, 8, NULL, 0, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_eq(stof_format_build_family(ctx, fam, 8, 8, NULL, 0, 16, 16,
                                          NULL),
                 STOF_ERR_INVALID_ARGUMENT);

    /* Bad block sizes, on both sides, with and without rows. */
    const int bad[] = {0, -16, 8, 15, 17, 48, 100, 512, 1 << 30};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        for (int sq = 1; sq <= 41; sq += 40) {
            f = (stof_format *)(uintptr_t)1;
            cr_assert_eq(stof_format_build_family(ctx, fam, sq, 40, NULL, 0,
                                                  bad[i], 16, &f),
                         STOF_ERR_INVALID_ARGUMENT, "block_m %d", bad[i]);
            cr_assert_null(f);
            cr_assert(strstr(stof_errmsg(ctx), "block_m"), "%s",
                      stof_errmsg(ctx));
            f = (stof_format *)(uintptr_t)1;
            cr_assert_eq(stof_format_build_family(ctx, fam, sq, 40, NULL, 0,
                                                  16, bad[i], &f),
                         STOF_ERR_INVALID_ARGUMENT, "block_n %d", bad[i]);
            cr_assert_null(f);
            cr_assert(strstr(stof_errmsg(ctx), "block_n"), "%s",
                      stof_errmsg(ctx));
        }
    }
    /* A success clears the message. */
    cr_assert_eq(stof_format_build_family(ctx, fam, 40, 40, NULL, 0, 16, 16,
                                          &f),
                 STOF_OK);
    cr_assert_str_eq(stof_errmsg(ctx), "");
    stof_format_free(&f);
    stof_mask_family_free(&fam);
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* 5. Parser and canonical text                                              */
/* ------------------------------------------------------------------------ */

static int masks_equal(const stof_mask *a, const stof_mask *b)
{
    if (stof_mask_seq_q(a) != stof_mask_seq_q(b) ||
        stof_mask_seq_k(a) != stof_mask_seq_k(b))
        return 0;
    for (int q = 0; q < stof_mask_seq_q(a); q++)
        for (int k = 0; k < stof_mask_seq_k(a); k++)
            if (stof_mask_get(a, q, k) != stof_mask_get(b, q, k))
                return 0;
    return 1;
}

/* The packed layout's host data: sequence b of cu_seqlens is the mask of
 * the same family with the padded data (its lengths, its doc ids copied
 * out of the packed array), and bad offsets are named. */
Test(family, packed_data)
{
    stof_context *ctx = open_ctx();
    const char *specs[] = {"causal&docs", "sliding:5|prefix", "bigbird:4:1:1:2:3",
                           "!causal&docs"};
    const int32_t cu_q[4] = {0, 5, 5, 17}, cu_k[4] = {0, 7, 9, 30};
    int32_t doc[30], pdoc[3 * 40], q_len[3], k_len[3];
    int32_t prefix[3] = {2, 0, 6}, q_off[3] = {0, 3, 1};
    uint64_t seeds[3] = {0, 5, 99};
    for (int k = 0; k < 30; k++)
        doc[k] = k / 4 + (k >= 9 ? 100 : 0);
    for (int b = 0; b < 3; b++) {
        q_len[b] = cu_q[b + 1] - cu_q[b];
        k_len[b] = cu_k[b + 1] - cu_k[b];
        for (int k = 0; k < 40; k++)
            pdoc[b * 40 + k] = k < k_len[b] ? doc[cu_k[b] + k] : 1000;
    }
    stof_mask_data pk, pd;
    memset(&pk, 0, sizeof(pk));
    memset(&pd, 0, sizeof(pd));
    pk.cu_seqlens_q = cu_q;
    pk.cu_seqlens_k = cu_k;
    pk.doc_id = doc;
    pk.prefix = pd.prefix = prefix;
    pk.q_offset = pd.q_offset = q_off;
    pk.seed = pd.seed = seeds;
    pd.q_len = q_len;
    pd.k_len = k_len;
    pd.doc_id = pdoc;
    pd.doc_stride = 40;
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
        stof_mask_family *fam = fam_make(ctx, specs[i]);
        cr_assert_eq(stof_mask_data_check(ctx, fam, 3, 17, 30, &pk), STOF_OK,
                     "%s", stof_errmsg(ctx));
        for (int b = 0; b < 3; b++) {
            stof_mask *a = NULL, *c = NULL;
            cr_assert_eq(stof_mask_family_eval(ctx, fam, 20, 40, &pk, b, &a),
                         STOF_OK, "%s", stof_errmsg(ctx));
            cr_assert_eq(stof_mask_family_eval(ctx, fam, 20, 40, &pd, b, &c),
                         STOF_OK, "%s", stof_errmsg(ctx));
            cr_assert(masks_equal(a, c), "%s: packed sequence %d", specs[i], b);
            cr_assert(b == 1 || stof_mask_count(a) > 0, "%s: %d is empty",
                      specs[i], b);
            stof_mask_free(&a);
            stof_mask_free(&c);
        }
        stof_mask_family_free(&fam);
    }
    /* Bad offsets and combinations, each named. */
    stof_mask_family *fam = fam_make(ctx, "causal");
    int32_t bad[4];
    memcpy(bad, cu_q, sizeof(bad));
    pk.cu_seqlens_q = bad;
    pk.doc_id = NULL;
    bad[2] = 3;
    expect_bad(ctx, fam, 17, 30, &pk, 1, "cu_seqlens_q decreases", "decrease");
    bad[2] = 5;
    bad[0] = -1;
    expect_bad(ctx, fam, 17, 30, &pk, 0, "is negative", "negative offset");
    bad[0] = 0;
    cr_assert_eq(stof_mask_data_check(ctx, fam, 3, 16, 30, &pk),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "past the 16 query rows"), "%s",
              stof_errmsg(ctx));
    cr_assert_eq(stof_mask_data_check(ctx, fam, 3, 17, 29, &pk),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "cu_seqlens_k[3] = 30"), "%s",
              stof_errmsg(ctx));
    pk.total_q = 18;
    cr_assert_eq(stof_mask_data_check(ctx, fam, 3, 17, 30, &pk),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "exceed"), "%s", stof_errmsg(ctx));
    pk.total_q = 16; /* fewer rows than the offsets reach */
    cr_assert_eq(stof_mask_data_check(ctx, fam, 3, 17, 30, &pk),
                 STOF_ERR_INVALID_ARGUMENT);
    pk.total_q = 0;
    stof_mask *m = NULL;
    cr_assert_eq(stof_mask_family_eval(ctx, fam, 11, 40, &pk, 2, &m),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "larger than"), "%s", stof_errmsg(ctx));
    pk.q_len = q_len;
    expect_bad(ctx, fam, 17, 30, &pk, 0, "leave q_len and k_len NULL",
               "lengths with offsets");
    pk.q_len = NULL;
    pk.cu_seqlens_q = NULL;
    expect_bad(ctx, fam, 17, 30, &pk, 0, "without cu_seqlens_q",
               "k offsets alone");
    stof_mask_family_free(&fam);

    /* Bitmaps of the wrong size are named. */
    fam = fam_make(ctx, "bitmap");
    uint32_t bits[2 * 17 * 3];
    memset(bits, 0xff, sizeof(bits));
    stof_mask_data bd;
    memset(&bd, 0, sizeof(bd));
    bd.bitmap = bits;
    bd.bitmap_words = 1;
    expect_bad(ctx, fam, 17, 40, &bd, 0, "bitmap_words = 1", "narrow rows");
    bd.bitmap_words = 2;
    bd.bitmap_stride = 33;
    expect_bad(ctx, fam, 17, 40, &bd, 0, "bitmap_stride = 33", "overlap");
    bd.bitmap_stride = 34;
    cr_assert_eq(stof_mask_data_check(ctx, fam, 3, 17, 40, &bd), STOF_OK, "%s",
                 stof_errmsg(ctx));
    /* Packed: each sequence's rows. */
    bd.cu_seqlens_q = cu_q;
    bd.cu_seqlens_k = cu_k;
    bd.bitmap_stride = 2 * 11;
    expect_bad(ctx, fam, 17, 40, &bd, 2, "the 12 rows x 2 words of sequence 2",
               "packed overlap");
    bd.bitmap_stride = 2 * 12;
    cr_assert_eq(stof_mask_data_check(ctx, fam, 3, 17, 40, &bd), STOF_OK, "%s",
                 stof_errmsg(ctx));
    stof_mask_family_free(&fam);

    /* The packed descriptor, and plans that cannot take it. */
    stof_attention_desc d;
    cr_assert_eq(stof_attention_desc_init(&d, 3, 4, 17, 30, 64,
                                          STOF_DTYPE_FP16, STOF_LAYOUT_PACKED),
                 STOF_OK);
    cr_assert(d.q_stride[0] == 0 && d.q_stride[1] == 64 &&
                  d.q_stride[2] == 256 && d.k_stride[2] == 256,
              "packed strides");
    stof_mask *cm = NULL;
    cr_assert_eq(stof_mask_from_spec(ctx, "causal", 17, 30, &cm), STOF_OK);
    stof_plan *plan = (stof_plan *)(uintptr_t)1;
    cr_assert_eq(stof_attention_plan(ctx, &d, cm, &plan),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert_null(plan);
    cr_assert(strstr(stof_errmsg(ctx), "stof_attention_plan_family"), "%s",
              stof_errmsg(ctx));
    stof_mask_free(&cm);
    fam = fam_make(ctx, "causal");
    cr_assert_eq(stof_attention_plan_family(ctx, &d, fam, NULL, &plan),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "cu_seqlens_q"), "%s",
              stof_errmsg(ctx));
    stof_mask_data one;
    memset(&one, 0, sizeof(one));
    one.cu_seqlens_q = cu_q;
    cr_assert_eq(stof_attention_desc_init(&d, 3, 4, 17, 17, 64,
                                          STOF_DTYPE_FP16, STOF_LAYOUT_BSHD),
                 STOF_OK);
    cr_assert_eq(stof_attention_plan_family(ctx, &d, fam, &one, &plan),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_errmsg(ctx), "not STOF_LAYOUT_PACKED"), "%s",
              stof_errmsg(ctx));
    stof_mask_family_free(&fam);
    stof_close(&ctx);
}

/* A family's sample instance as the blob a cache-only miss keeps for
 * `stof-tune pending`: every array back, equal; malformed blobs refused. */
Test(family, sample_blob_round_trip)
{
    const int32_t cu_q[4] = {0, 5, 5, 17}, cu_k[4] = {0, 7, 9, 30};
    int32_t doc[30], prefix[3] = {1, 2, 3}, hw[4] = {3, 0, 9, 100};
    uint64_t seeds[3] = {7, 0, 1ull << 60};
    uint32_t bits[3 * 12];
    for (int i = 0; i < 30; i++)
        doc[i] = i / 6;
    for (int i = 0; i < 36; i++)
        bits[i] = 0x9e3779b9u * (uint32_t)(i + 1);
    stof_attention_desc d;
    cr_assert_eq(stof_attention_desc_init(&d, 3, 4, 17, 30, 64,
                                          STOF_DTYPE_FP16, STOF_LAYOUT_PACKED),
                 STOF_OK);
    stof_mask_data h;
    memset(&h, 0, sizeof(h));
    h.cu_seqlens_q = cu_q;
    h.cu_seqlens_k = cu_k;
    h.doc_id = doc;
    h.prefix = prefix;
    h.seed = seeds;
    h.bitmap = bits;
    h.bitmap_words = 1;
    h.bitmap_stride = 12;
    h.head_window = hw;
    size_t n = 0;
    void *blob = stof__family_sample_pack(&d, &h, 1 << 20, &n);
    cr_assert_not_null(blob);
    stof_mask_data u;
    cr_assert(stof__family_sample_unpack(&d, blob, n, &u));
    cr_assert(!memcmp(u.cu_seqlens_q, cu_q, sizeof(cu_q)) &&
                  !memcmp(u.cu_seqlens_k, cu_k, sizeof(cu_k)) &&
                  !memcmp(u.doc_id, doc, sizeof(doc)) &&
                  !memcmp(u.prefix, prefix, sizeof(prefix)) &&
                  !memcmp(u.seed, seeds, sizeof(seeds)) &&
                  !memcmp(u.head_window, hw, sizeof(hw)) &&
                  !memcmp(u.bitmap, bits, sizeof(bits)),
              "arrays differ");
    cr_assert(!u.q_len && !u.k_len && !u.q_offset, "absent fields appear");
    cr_assert(u.bitmap_words == 1 && u.bitmap_stride == 12);
    /* Too small a limit: nothing kept. */
    size_t n2 = 1;
    cr_assert_null(stof__family_sample_pack(&d, &h, n - 1, &n2));
    cr_assert_eq(n2, 0);
    /* Truncated, a bad magic, a short array, offsets out of range: 0. */
    cr_assert(!stof__family_sample_unpack(&d, blob, n - 8, &u));
    cr_assert_null(u.cu_seqlens_q);
    unsigned char *c = malloc(n);
    memcpy(c, blob, n);
    c[0] ^= 1;
    cr_assert(!stof__family_sample_unpack(&d, c, n, &u), "bad magic");
    memcpy(c, blob, n);
    uint64_t sz;
    memcpy(&sz, c + 8 * (1 + 4), 8); /* doc_id's size */
    sz -= 4;
    memcpy(c + 8 * (1 + 4), &sz, 8);
    cr_assert(!stof__family_sample_unpack(&d, c, n, &u), "short doc_id");
    /* A larger plan needs more than the blob holds (docs of 30 keys). */
    memcpy(c, blob, n);
    stof_attention_desc d2 = d;
    d2.batch = 4;
    cr_assert(!stof__family_sample_unpack(&d2, c, n, &u), "fewer offsets");
    d2 = d;
    d2.seq_q = 16; /* cu_seqlens_q[3] = 17 is past it */
    cr_assert(!stof__family_sample_unpack(&d2, c, n, &u), "offsets past");
    /* A stride no blob could hold. */
    uint64_t big = (uint64_t)1 << 40;
    memcpy(c + 8 * (1 + 10 + 1), &big, 8);
    cr_assert(!stof__family_sample_unpack(&d, c, n, &u), "huge stride");
    free(c);
    free(blob);
    /* Packed bitmaps hold each sequence's own rows: a buffer that ends
     * with the last (short) sequence's rows is read no further (ASan). */
    {
        const int32_t cq[3] = {0, 100, 110};
        stof_attention_desc pd;
        stof_attention_desc_init(&pd, 2, 1, 110, 110, 64, STOF_DTYPE_FP16,
                                 STOF_LAYOUT_PACKED);
        uint32_t *pb = malloc(880 * sizeof(uint32_t));
        for (int i = 0; i < 880; i++)
            pb[i] = (uint32_t)i * 2654435761u;
        stof_mask_data pm;
        memset(&pm, 0, sizeof(pm));
        pm.cu_seqlens_q = cq;
        pm.bitmap = pb;
        pm.bitmap_words = 8;
        pm.bitmap_stride = 800;
        void *pbl = stof__family_sample_pack(&pd, &pm, 1 << 20, &n);
        cr_assert_not_null(pbl);
        cr_assert(stof__family_sample_unpack(&pd, pbl, n, &u));
        cr_assert(!memcmp(u.bitmap, pb, 880 * sizeof(uint32_t)),
                  "packed bitmap differs");
        free(pbl);
        free(pb);
    }
    /* Padded data round-trips too, and no data packs to an empty one. */
    stof_attention_desc_init(&d, 2, 1, 8, 8, 64, STOF_DTYPE_FP16,
                             STOF_LAYOUT_BHSD);
    int32_t ql[2] = {3, 8};
    stof_mask_data p;
    memset(&p, 0, sizeof(p));
    p.q_len = ql;
    blob = stof__family_sample_pack(&d, &p, 1 << 20, &n);
    cr_assert(stof__family_sample_unpack(&d, blob, n, &u));
    cr_assert(u.q_len && u.q_len[0] == 3 && u.q_len[1] == 8 && !u.k_len);
    free(blob);
}

/* The canonical text of `spec` is a fixed point whose family has the same
 * masks as spec's on inst. */
static void check_canonical(stof_context *ctx, const char *spec,
                            const inst *in)
{
    stof_mask_family *f1 = fam_make(ctx, spec);
    char c1[8192];
    snprintf(c1, sizeof(c1), "%s", stof_mask_family_spec(f1));
    cr_assert(strlen(c1) > 0);
    for (const char *p = c1; *p; p++)
        cr_assert(*p != ' ' && *p != '\t', "canonical \"%s\" has spaces", c1);
    stof_mask_family *f2 = NULL;
    stof_status st = stof_mask_family_create(ctx, c1, &f2);
    cr_assert_eq(st, STOF_OK,
                 "canonical text \"%s\" of \"%s\" does not parse: %s",
                 c1, spec, stof_errmsg(ctx));
    cr_assert_str_eq(stof_mask_family_spec(f2), c1,
                     "canonical text of \"%s\" is not a fixed point", spec);
    for (int b = 0; b < in->batch; b++) {
        stof_mask *m1 = NULL, *m2 = NULL;
        cr_assert_eq(stof_mask_family_eval(ctx, f1, in->sq, in->sk, &in->d, b,
                                           &m1),
                     STOF_OK);
        cr_assert_eq(stof_mask_family_eval(ctx, f2, in->sq, in->sk, &in->d, b,
                                           &m2),
                     STOF_OK);
        cr_assert(masks_equal(m1, m2), "\"%s\" and its canonical \"%s\" differ",
                  spec, c1);
        stof_mask_free(&m1);
        stof_mask_free(&m2);
    }
    stof_mask_family_free(&f1);
    stof_mask_family_free(&f2);
}

Test(family, parser_new_forms_and_canonical_text)
{
    stof_context *ctx = open_ctx();
    tu_rng rng = {tu_seed() ^ 0x6666};
    static const struct {
        const char *in, *canon;
    } want[] = {
        {"  causal | prefix ", "causal|prefix"},
        {"docs", "docs"},
        {"prefix", "prefix"},
        {"prefix : 7", "prefix:7"},
        {"prefix:0", "prefix:0"},
        {"! causal", "!causal"},
        {"!!causal", "!!causal"},
        {"! ( causal | sliding : 4 )", "!(causal|sliding:4)"},
        {"!(causal&docs)", "!(causal&docs)"},
        {"!(causal)", "!causal"},
        {"((docs))&(causal)", "docs&causal"},
        {"causal&(docs|prefix)", "causal&(docs|prefix)"},
        {"causal|(docs&prefix)", "causal|docs&prefix"},
        {"!causal&sliding:8", "!causal&sliding:8"},
        {"causal&docs", "causal&docs"},
        {"sliding:007", "sliding:7"},
    };
    inst in;
    inst_rand(&in, &rng, 90, 130, 2);
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        stof_mask_family *f = fam_make(ctx, want[i].in);
        cr_assert_str_eq(stof_mask_family_spec(f), want[i].canon,
                         "canonical of \"%s\"", want[i].in);
        stof_mask_family_free(&f);
        check_canonical(ctx, want[i].in, &in);
    }
    /* "!causal&sliding:8" is (!causal)&sliding:8, not !(causal&sliding:8). */
    {
        stof_mask *a = NULL, *b = NULL;
        cr_assert_eq(stof_mask_from_spec(ctx, "!causal&sliding:8", 40, 40, &a),
                     STOF_OK);
        cr_assert_eq(stof_mask_from_spec(ctx, "(!causal)&sliding:8", 40, 40,
                                         &b),
                     STOF_OK);
        cr_assert(masks_equal(a, b));
        cr_assert_eq(stof_mask_count(a), 7 * 40 - 28);
        stof_mask_free(&a);
        stof_mask_free(&b);
    }
    /* Random trees (every leaf, random whitespace and parentheses). */
    for (int i = 0; i < 800; i++) {
        onode *tree = rand_tree(&rng, 4, 1);
        sbuf s = {{0}, 0};
        print_tree(&s, tree, &rng, 1);
        check_canonical(ctx, s.b, &in);
        ofree(tree);
    }
    inst_free(&in);
    stof_close(&ctx);
}

/* The canonical text of a family made from `spec`, re-created: NULL when it
 * parses back to itself, else what went wrong (static). */
static const char *canonical_problem(stof_context *ctx, const char *spec)
{
    static char buf[1024];
    stof_mask_family *f1 = fam_make(ctx, spec), *f2 = NULL;
    char c1[256];
    snprintf(c1, sizeof(c1), "%s", stof_mask_family_spec(f1));
    stof_mask_family_free(&f1);
    if (stof_mask_family_create(ctx, c1, &f2) != STOF_OK) {
        snprintf(buf, sizeof(buf), "\"%s\" -> \"%s\", which does not parse "
                 "(%.120s)", spec, c1, stof_errmsg(ctx));
        return buf;
    }
    const char *c2 = stof_mask_family_spec(f2);
    int same = strcmp(c1, c2) == 0;
    if (!same)
        snprintf(buf, sizeof(buf), "\"%s\" -> \"%s\" -> \"%s\"", spec, c1, c2);
    stof_mask_family_free(&f2);
    return same ? NULL : buf;
}

/* Probabilities of random written in many ways: the canonical text parses
 * back to itself (small P included, whose %g form has an exponent). */
Test(family, canonical_text_of_probabilities)
{
    stof_context *ctx = open_ctx();
    tu_rng rng = {tu_seed() ^ 0x7777};
    const char *fixed[] = {"0.1", "0.3", ".5", "1", "0", "1.000", "0.25",
                           "0.0001", "0.000123456789",
                           "0.99999999999999999999", "0.00001",
                           "0.000000000000000000000000001", "0.95022480118273",
                           "0.1836916702152088243"};
    char spec[128], report[2048] = "";
    int n_bad = 0, n = 0;
    for (int i = 0; i < 2000 + (int)(sizeof(fixed) / sizeof(fixed[0])); i++) {
        if (i < (int)(sizeof(fixed) / sizeof(fixed[0]))) {
            snprintf(spec, sizeof(spec), "random:%s:5", fixed[i]);
        } else {
            double p = tu_uniform(&rng);
            if (i % 3 == 0)
                p = ldexp(p, -(int)tu_below(&rng, 20));
            snprintf(spec, sizeof(spec), "random:%.*f:5",
                     1 + (int)tu_below(&rng, 19), p);
        }
        n++;
        const char *bad = canonical_problem(ctx, spec);
        if (bad) {
            if (n_bad++ < 4 &&
                strlen(report) + strlen(bad) + 4 < sizeof(report)) {
                strcat(report, "\n  ");
                strcat(report, bad);
            }
        }
    }
    cr_assert_eq(n_bad, 0,
                 "%d of %d canonical texts of random:P:5 are not fixed "
                 "points, e.g.:%s",
                 n_bad, n, report);
    stof_close(&ctx);
}

static const struct {
    const char *spec, *text;
} bad_specs[] = {
    {"prefix:1:2", "at most 1 parameter"},
    {"docs:3", "takes no parameters"},
    {"!", "expected a mask name, '!' or '('"},
    {"!!", "expected a mask name, '!' or '('"},
    {"! ", "the end of the spec"},
    {"causal&!", "expected a mask name"},
    {"!)", "expected a mask name"},
    {"causal!", "unexpected '!'"},
    {"prefix:", "non-negative integer for P of prefix"},
    {"prefix:-1", "non-negative integer for P of prefix"},
    {"doc", "unknown mask"},
    {"docs(", "unexpected '('"},
};

Test(family, parser_errors)
{
    stof_context *ctx = open_ctx();
    for (size_t i = 0; i < sizeof(bad_specs) / sizeof(bad_specs[0]); i++) {
        stof_mask_family *fam = (stof_mask_family *)(uintptr_t)1;
        stof_status st = stof_mask_family_create(ctx, bad_specs[i].spec, &fam);
        cr_assert_eq(st, STOF_ERR_INVALID_ARGUMENT, "\"%s\" gave %s",
                     bad_specs[i].spec, stof_status_name(st));
        cr_assert_null(fam, "\"%s\"", bad_specs[i].spec);
        cr_assert(strstr(stof_errmsg(ctx), bad_specs[i].text),
                  "\"%s\": \"%s\" not in: %s", bad_specs[i].spec,
                  bad_specs[i].text, stof_errmsg(ctx));
        cr_assert(strstr(stof_errmsg(ctx), "column"), "%s", stof_errmsg(ctx));
        /* stof_mask_from_spec refuses it the same way. */
        stof_mask *m = (stof_mask *)(uintptr_t)1;
        st = stof_mask_from_spec(ctx, bad_specs[i].spec, 8, 8, &m);
        cr_assert_eq(st, STOF_ERR_INVALID_ARGUMENT, "\"%s\"",
                     bad_specs[i].spec);
        cr_assert_null(m);
        cr_assert(strstr(stof_errmsg(ctx), bad_specs[i].text),
                  "\"%s\": \"%s\" not in: %s", bad_specs[i].spec,
                  bad_specs[i].text, stof_errmsg(ctx));
    }
    /* 64 nested negations are accepted, 65 are refused. */
    char deep[128];
    for (int n = 64; n <= 65; n++) {
        memset(deep, '!', (size_t)n);
        strcpy(deep + n, "causal");
        stof_mask_family *fam = NULL;
        stof_status st = stof_mask_family_create(ctx, deep, &fam);
        if (n == 64) {
            cr_assert_eq(st, STOF_OK, "%s", stof_errmsg(ctx));
            stof_mask *m = NULL;
            cr_assert_eq(stof_mask_family_eval(ctx, fam, 10, 10, NULL, 0, &m),
                         STOF_OK);
            cr_assert_eq(stof_mask_count(m), 55); /* an even number of ! */
            stof_mask_free(&m);
            stof_mask_family_free(&fam);
        } else {
            cr_assert_eq(st, STOF_ERR_INVALID_ARGUMENT);
            cr_assert_null(fam);
        }
    }
    stof_close(&ctx);
}

/* stof_mask_from_spec with the new forms, on the default data (no query
 * offset, one document, prefix 0). */
Test(family, mask_from_spec_new_forms)
{
    stof_context *ctx = open_ctx();
    const int dims[][2] = {{1, 1}, {7, 63}, {65, 64}, {200, 130}, {130, 333}};
    for (size_t s = 0; s < sizeof(dims) / sizeof(dims[0]); s++) {
        const int sq = dims[s][0], sk = dims[s][1];
        stof_mask *c = NULL, *nc = NULL;
        cr_assert_eq(stof_mask_from_spec(ctx, "causal", sq, sk, &c), STOF_OK);
        cr_assert_eq(stof_mask_from_spec(ctx, "!causal", sq, sk, &nc), STOF_OK,
                     "%s", stof_errmsg(ctx));
        for (int q = 0; q < sq; q++)
            for (int k = 0; k < sk; k++)
                cr_assert_eq(stof_mask_get(nc, q, k), !stof_mask_get(c, q, k),
                             "!causal %dx%d at (%d,%d)", sq, sk, q, k);
        cr_assert_eq(stof_mask_count(nc) + stof_mask_count(c),
                     (uint64_t)sq * (uint64_t)sk);
        stof_mask_free(&c);
        stof_mask_free(&nc);

        const char *specs[] = {"causal|prefix:5", "docs", "prefix",
                               "!docs|prefix:70", "causal&docs",
                               "!(causal|prefix:3)&docs"};
        oseq os = {sq, sk, 0, 0, NULL, NULL, 0, 0, 0};
        for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
            onode *tree = tparse_spec(specs[i]);
            stof_mask *m = NULL;
            cr_assert_eq(stof_mask_from_spec(ctx, specs[i], sq, sk, &m),
                         STOF_OK, "%s", stof_errmsg(ctx));
            for (int q = 0; q < sq; q++)
                for (int k = 0; k < sk; k++)
                    if (stof_mask_get(m, q, k) != oracle(tree, &os, q, k))
                        cr_assert_fail("stof_mask_from_spec(\"%s\") %dx%d at "
                                       "(%d,%d): %d, oracle %d",
                                       specs[i], sq, sk, q, k,
                                       stof_mask_get(m, q, k),
                                       oracle(tree, &os, q, k));
            /* The family without data gives the same mask. */
            stof_mask_family *fam = fam_make(ctx, specs[i]);
            stof_mask *e = NULL;
            cr_assert_eq(stof_mask_family_eval(ctx, fam, sq, sk, NULL, 0, &e),
                         STOF_OK);
            cr_assert(masks_equal(m, e), "%s", specs[i]);
            stof_mask_free(&e);
            stof_mask_family_free(&fam);
            stof_mask_free(&m);
            ofree(tree);
        }
    }
    stof_close(&ctx);
}

/* ------------------------------------------------------------------------ */
/* 6. Long contexts without a bit matrix                                     */
/* ------------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Row q allows exactly keys lo(q)..hi(q) (empty when lo > hi), with lo and
 * hi non-decreasing in q. */
typedef void (*row_interval)(const void *u, int64_t q, int64_t *lo,
                             int64_t *hi);

/* Check a format against such a mask: every tile (kind, column, bitmap
 * index), the counts, the fills, every row-wise key list; and, for the row
 * blocks in `sample`, every bit of the partial tiles and row-wise bitmaps.
 * Returns the allowed elements. */
static uint64_t check_interval_format(const stof_format *f, int n, int nk,
                                      row_interval iv, const void *u,
                                      const int *sample, int n_sample,
                                      const char *what)
{
    const int bm = f->block_m, bn = f->block_n;
    const int nrb = (n + bm - 1) / bm, ncb = (nk + bn - 1) / bn;
    const int bwpr = f->bitmap_words_per_row;
    cr_assert_eq(f->n_row_blocks, nrb, "%s", what);
    cr_assert_eq(f->n_col_blocks, ncb, "%s", what);
    cr_assert_eq(f->row_ptr[0], 0);
    cr_assert_eq(f->rw_ptr[0], 0);
    uint64_t *cnt = calloc((size_t)ncb, sizeof(uint64_t));
    cr_assert_not_null(cnt);
    uint64_t allowed = 0, pin = 0, parea = 0, rwarea = 0;
    int64_t e = 0, part = 0, n_full = 0;
    int64_t prev_lo = -1, prev_hi = -1;
    for (int i = 0; i < nrb; i++) {
        const int rows = n - i * bm < bm ? n - i * bm : bm;
        int jmin = ncb, jmax = -1;
        /* Union of the rows' intervals: runs, merged in order. */
        int64_t run_lo[2 * 256 + 1], run_hi[2 * 256 + 1];
        int nrun = 0;
        for (int r = 0; r < rows; r++) {
            int64_t lo, hi;
            iv(u, (int64_t)i * bm + r, &lo, &hi);
            if (lo > hi)
                continue;
            cr_assert(lo >= prev_lo && hi >= prev_hi, "intervals must grow");
            prev_lo = lo;
            prev_hi = hi;
            allowed += (uint64_t)(hi - lo + 1);
            for (int64_t j = lo / bn; j <= hi / bn; j++) {
                int64_t a = lo > j * bn ? lo : j * bn;
                int64_t b = hi < j * bn + bn - 1 ? hi : j * bn + bn - 1;
                cnt[j] += (uint64_t)(b - a + 1);
            }
            if (lo / bn < jmin)
                jmin = (int)(lo / bn);
            if (hi / bn > jmax)
                jmax = (int)(hi / bn);
            if (nrun && lo <= run_hi[nrun - 1] + 1) {
                if (hi > run_hi[nrun - 1])
                    run_hi[nrun - 1] = hi;
            } else {
                run_lo[nrun] = lo;
                run_hi[nrun++] = hi;
            }
        }
        /* Tiles. */
        int in_sample = 0;
        for (int s = 0; s < n_sample; s++)
            in_sample |= sample[s] == i;
        for (int j = jmin; j <= jmax; j++) {
            if (!cnt[j])
                continue;
            const int cols = nk - j * bn < bn ? nk - j * bn : bn;
            const uint64_t area = (uint64_t)rows * (uint64_t)cols;
            cr_assert(e < f->row_ptr[i + 1], "%s: row block %d lacks tile %d",
                      what, i, j);
            cr_assert_eq(f->col_idx[e], j, "%s: row block %d entry %lld", what,
                         i, (long long)e);
            if (cnt[j] == area) {
                cr_assert_eq(f->kind[e], STOF_TILE_FULL, "%s tile (%d,%d)",
                             what, i, j);
                cr_assert_eq(f->bitmap_idx[e], -1);
                n_full++;
            } else {
                cr_assert_eq(f->kind[e], STOF_TILE_PARTIAL, "%s tile (%d,%d)",
                             what, i, j);
                cr_assert_eq(f->bitmap_idx[e], part, "%s tile (%d,%d)", what, i,
                             j);
                if (in_sample) {
                    const uint32_t *bmp =
                        f->bitmaps + (size_t)part * (size_t)bm * (size_t)bwpr;
                    for (int r = 0; r < bm; r++) {
                        int64_t lo = 1, hi = 0;
                        if (r < rows)
                            iv(u, (int64_t)i * bm + r, &lo, &hi);
                        for (int c = 0; c < 32 * bwpr; c++) {
                            int64_t k = (int64_t)j * bn + c;
                            int want = c < bn && k < nk && k >= lo && k <= hi;
                            int got = (bmp[r * bwpr + c / 32] >> (c % 32)) & 1;
                            if (got != want)
                                cr_assert_fail("%s tile (%d,%d) bit (%d,%d): "
                                               "%d",
                                               what, i, j, r, c, got);
                        }
                    }
                }
                part++;
                pin += cnt[j];
                parea += area;
            }
            cnt[j] = 0;
            e++;
        }
        cr_assert_eq(f->row_ptr[i + 1], e, "%s: row_ptr[%d]", what, i + 1);
        /* Row-wise keys. */
        int64_t nkeys = 0;
        for (int r = 0; r < nrun; r++)
            nkeys += run_hi[r] - run_lo[r] + 1;
        cr_assert_eq(f->rw_ptr[i + 1] - f->rw_ptr[i], nkeys,
                     "%s: row block %d keys", what, i);
        const int32_t *keys = f->rw_keys + f->rw_ptr[i];
        int64_t t = 0;
        for (int r = 0; r < nrun; r++)
            for (int64_t k = run_lo[r]; k <= run_hi[r]; k++, t++)
                if (keys[t] != k)
                    cr_assert_fail("%s: row block %d key %lld is %d, expected "
                                   "%lld",
                                   what, i, (long long)t, keys[t],
                                   (long long)k);
        const int64_t words = (nkeys + 31) / 32;
        cr_assert_eq(f->rw_words[i], words);
        cr_assert_eq(f->rw_bitmap_off[i + 1] - f->rw_bitmap_off[i],
                     (int64_t)bm * words);
        if (in_sample) {
            const uint32_t *bmp = f->rw_bitmaps + f->rw_bitmap_off[i];
            for (int r = 0; r < bm; r++) {
                int64_t lo = 1, hi = 0;
                if (r < rows)
                    iv(u, (int64_t)i * bm + r, &lo, &hi);
                for (int64_t x = 0; x < 32 * words; x++) {
                    int want = x < nkeys && keys[x] >= lo && keys[x] <= hi;
                    int got = (bmp[r * words + x / 32] >> (x % 32)) & 1;
                    if (got != want)
                        cr_assert_fail("%s: row block %d row-wise bit (%d,%lld)"
                                       ": %d",
                                       what, i, r, (long long)x, got);
                }
            }
        }
        rwarea += (uint64_t)rows * (uint64_t)nkeys;
    }
    cr_assert_eq(f->allowed, allowed, "%s", what);
    cr_assert_eq(f->n_full, n_full, "%s", what);
    cr_assert_eq(f->n_partial, part, "%s", what);
    cr_assert_eq(f->n_empty, (int64_t)nrb * ncb - n_full - part, "%s", what);
    cr_assert(f->partial_fill == (parea ? (double)pin / (double)parea : 0.0),
              "%s: partial_fill %.17g", what, f->partial_fill);
    cr_assert(f->rowwise_fill ==
                  (rwarea ? (double)allowed / (double)rwarea : 0.0),
              "%s: rowwise_fill %.17g", what, f->rowwise_fill);
    free(cnt);
    return allowed;
}

typedef struct band {
    int64_t n, w;
} band;

static void band_iv(const void *u, int64_t q, int64_t *lo, int64_t *hi)
{
    const band *b = u;
    *lo = q - b->w + 1 < 0 ? 0 : q - b->w + 1;
    *hi = q + b->w - 1 > b->n - 1 ? b->n - 1 : q + b->w - 1;
}

Test(family, long_context_sliding_131072)
{
    stof_context *ctx = open_ctx();
    const int n = 131072, w = 4096, bs = 128;
    stof_mask_family *fam = fam_make(ctx, "sliding:4096");
    stof_format *f = NULL;
    double t0 = now_s();
    stof_status st =
        stof_format_build_family(ctx, fam, n, n, NULL, 0, bs, bs, &f);
    double dt = now_s() - t0;
    cr_assert_eq(st, STOF_OK, "%s", stof_errmsg(ctx));
    cr_log_info("stof_format_build_family(sliding:4096, %d x %d, 128x128): "
                "%.3f s",
                n, n, dt);
    fprintf(stderr, "sliding:4096 at %d: stof_format_build_family %.3f s\n", n,
            dt);
    cr_assert(dt < 20.0, "sliding:4096 at %d took %.1f s", n, dt);

    /* Closed form: a band of W = 32 tiles each side, 128 | n. Row block i
     * has full tiles |i-j| <= 31 and partial tiles |i-j| = 32 (within
     * 0..1023), each of those with 127*128/2 allowed elements. */
    const int nb = n / bs, r = w / bs; /* 1024, 32 */
    cr_assert_eq(f->n_row_blocks, nb);
    cr_assert_eq(f->n_col_blocks, nb);
    int64_t full = 0, partial = 0, keys = 0;
    for (int i = 0; i < nb; i++) {
        int jlo = i - r < 0 ? 0 : i - r, jhi = i + r > nb - 1 ? nb - 1 : i + r;
        cr_assert_eq(f->row_ptr[i + 1] - f->row_ptr[i], jhi - jlo + 1,
                     "row block %d: tiles", i);
        cr_assert_eq(f->col_idx[f->row_ptr[i]], jlo, "row block %d", i);
        int flo = i - r + 1 < 0 ? 0 : i - r + 1;
        int fhi = i + r - 1 > nb - 1 ? nb - 1 : i + r - 1;
        full += fhi - flo + 1;
        partial += (i - r >= 0) + (i + r <= nb - 1);
        int64_t klo = (int64_t)i * bs - w + 1;
        int64_t khi = (int64_t)i * bs + bs - 1 + w - 1;
        klo = klo < 0 ? 0 : klo;
        khi = khi > n - 1 ? n - 1 : khi;
        cr_assert_eq(f->rw_ptr[i + 1] - f->rw_ptr[i], khi - klo + 1,
                     "row block %d: keys", i);
        keys += khi - klo + 1;
    }
    cr_assert_eq(full, 63520);
    cr_assert_eq(partial, 1984);
    cr_assert_eq(f->n_full, full);
    cr_assert_eq(f->n_partial, partial);
    cr_assert_eq(f->n_empty, (int64_t)nb * nb - full - partial);
    cr_assert_eq(f->rw_ptr[nb], keys);
    /* n (2W-1) minus the two clipped triangles of W(W-1)/2. */
    const uint64_t allowed =
        (uint64_t)n * (2 * w - 1) - (uint64_t)w * (uint64_t)(w - 1);
    cr_assert_eq(allowed, 1056837632ull);
    cr_assert_eq(f->allowed, allowed);
    cr_assert(f->partial_fill == 8128.0 / 16384.0, "partial_fill %.17g",
              f->partial_fill);

    /* Everything, tile by tile (bits of a few row blocks). */
    band bd = {n, w};
    const int sample[] = {0, 1, 31, 32, 33, 500, 990, 991, 992, 1023};
    check_interval_format(f, n, n, band_iv, &bd, sample,
                          (int)(sizeof(sample) / sizeof(sample[0])),
                          "sliding:4096 at 131072");
    stof_format_free(&f);
    stof_mask_family_free(&fam);
    stof_close(&ctx);
}

typedef struct docs_iv_u {
    int64_t n, len;
} docs_iv_u;

static void docs_iv(const void *u, int64_t q, int64_t *lo, int64_t *hi)
{
    const docs_iv_u *d = u;
    *lo = q / d->len * d->len;
    *hi = q;
}

Test(family, long_context_causal_docs_262144)
{
    stof_context *ctx = open_ctx();
    const int n = 262144, len = 1000, bs = 128;
    int32_t *doc = malloc((size_t)n * sizeof(int32_t));
    cr_assert_not_null(doc);
    for (int k = 0; k < n; k++)
        doc[k] = k / len;
    stof_mask_data d;
    memset(&d, 0, sizeof(d));
    d.doc_id = doc;
    stof_mask_family *fam = fam_make(ctx, "causal&docs");
    cr_assert_eq(stof_mask_data_check(ctx, fam, 1, n, n, &d), STOF_OK);
    stof_format *f = NULL;
    double t0 = now_s();
    stof_status st =
        stof_format_build_family(ctx, fam, n, n, &d, 0, bs, bs, &f);
    double dt = now_s() - t0;
    cr_assert_eq(st, STOF_OK, "%s", stof_errmsg(ctx));
    cr_log_info("stof_format_build_family(causal&docs, %d x %d, docs of %d, "
                "128x128): %.3f s",
                n, n, len, dt);
    fprintf(stderr, "causal&docs at %d: stof_format_build_family %.3f s\n", n,
            dt);
    cr_assert(dt < 20.0, "causal&docs at %d took %.1f s", n, dt);

    /* Closed form: 262 documents of 1000 and one of 144, each a causal
     * triangle. Row block i reaches from the document of its first row to
     * its diagonal tile, every tile between non-empty. */
    const int nb = n / bs;
    cr_assert_eq(f->n_row_blocks, nb);
    const uint64_t allowed = 262ull * 1000 * 1001 / 2 + 144ull * 145 / 2;
    cr_assert_eq(allowed, 131141440ull);
    cr_assert_eq(f->allowed, allowed);
    int64_t tiles = 0;
    for (int i = 0; i < nb; i++) {
        int64_t first = (int64_t)i * bs / len * len; /* the doc's start */
        int64_t jlo = first / bs;
        cr_assert_eq(f->row_ptr[i + 1] - f->row_ptr[i], i - jlo + 1,
                     "row block %d: tiles", i);
        cr_assert_eq(f->col_idx[f->row_ptr[i]], jlo, "row block %d", i);
        cr_assert_eq(f->col_idx[f->row_ptr[i + 1] - 1], i, "row block %d", i);
        /* The keys: from the first row's document start to the last row. */
        cr_assert_eq(f->rw_ptr[i + 1] - f->rw_ptr[i],
                     (int64_t)i * bs + bs - first, "row block %d: keys", i);
        tiles += i - jlo + 1;
    }
    cr_assert_eq(f->n_full + f->n_partial, tiles);
    docs_iv_u u = {n, len};
    const int sample[] = {0, 7, 8, 1000, 2047};
    check_interval_format(f, n, n, docs_iv, &u, sample,
                          (int)(sizeof(sample) / sizeof(sample[0])),
                          "causal&docs at 262144");
    stof_format_free(&f);
    stof_mask_family_free(&fam);
    free(doc);
    stof_close(&ctx);
}

/* The length buckets of family keys (stof.h's rule, attention_int.h). */
int stof__family_len_bucket(int n);

Test(family, length_buckets)
{
    static const int cases[][2] = {
        {1, 128},      {128, 128},    {129, 192},    {192, 192},
        {193, 256},    {257, 384},    {385, 512},    {1000, 1024},
        {1024, 1024},  {1025, 1536},  {1400, 1536},  {1537, 2048},
        {4096, 4096},  {5000, 6144},  {131072, 131072}, {131073, 196608},
        {1048576, 1048576},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        cr_assert_eq(stof__family_len_bucket(cases[i][0]), cases[i][1],
                     "bucket(%d) = %d, expected %d", cases[i][0],
                     stof__family_len_bucket(cases[i][0]), cases[i][1]);
    /* Every length maps to a bucket at least as large and at most 1.5x. */
    for (int n = 1; n < 70000; n += 7) {
        int b = stof__family_len_bucket(n);
        cr_assert(b >= n && (n < 128 || (double)b <= 1.5 * n + 1e-9),
                  "bucket(%d) = %d", n, b);
    }
}

/* A run's instance data is checked against the plan as
 * stof_mask_data_check checks host data: padded sequences' bitmaps that
 * would overlap (bitmap_stride below seq_q x bitmap_words) are refused by
 * name, before anything is launched (a plan made by hand: no GPU here). */
Test(family, run_refuses_overlapping_bitmaps)
{
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = "";
    stof_context *ctx = NULL;
    cr_assert_eq(stof_open(&ctx, &s), STOF_OK);
    stof_plan *p = calloc(1, sizeof(*p));
    cr_assert_not_null(p);
    p->ctx = ctx;
    p->family = 1;
    cr_assert_eq(stof_attention_desc_init(&p->desc, 4, 2, 256, 256, 64,
                                          STOF_DTYPE_FP16, STOF_LAYOUT_BHSD),
                 STOF_OK);
    uint32_t words[8];
    stof_mask_data d;
    memset(&d, 0, sizeof(d));
    d.bitmap = words;
    d.bitmap_stride = 1; /* 256 rows x 8 words a sequence */
    cr_assert_eq(stof_attention_run_family(p, &d, NULL, NULL, NULL, NULL, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_plan_errmsg(p), "bitmap_stride = 1"), "%s",
              stof_plan_errmsg(p));
    d.bitmap_words = 10;
    d.bitmap_stride = 256 * 10 - 1;
    cr_assert_eq(stof_attention_run_family(p, &d, NULL, NULL, NULL, NULL, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(stof_plan_errmsg(p), "bitmap_stride"), "%s",
              stof_plan_errmsg(p));
    /* Right strides pass the data checks (and stop at the tensors). */
    d.bitmap_stride = 256 * 10;
    cr_assert_eq(stof_attention_run_family(p, &d, NULL, NULL, NULL, NULL, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(!strstr(stof_plan_errmsg(p), "bitmap"), "%s", stof_plan_errmsg(p));
    d.bitmap_stride = 0; /* one bitmap for every sequence */
    cr_assert_eq(stof_attention_run_family(p, &d, NULL, NULL, NULL, NULL, NULL),
                 STOF_ERR_INVALID_ARGUMENT);
    cr_assert(!strstr(stof_plan_errmsg(p), "bitmap"), "%s", stof_plan_errmsg(p));
    free(p);
    stof_close(&ctx);
}
