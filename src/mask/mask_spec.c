/*
 * mask_spec.c - the mask spec language: a recursive-descent parser that
 * builds a small syntax tree, and an evaluator that fills the bit-packed
 * mask one row at a time.
 *
 * Grammar (whitespace between tokens is ignored):
 *
 *     expr   := term ('|' term)*
 *     term   := factor ('&' factor)*
 *     factor := '(' expr ')' | leaf
 *     leaf   := NAME (':' PARAM)*
 *
 * Unions and intersections are n-ary nodes, so a long chain "a|b|c|..." is
 * one wide node and the tree height is bounded by the parenthesis nesting
 * (at most SPEC_MAX_DEPTH): neither the parser nor the evaluator can be
 * driven into deep recursion by any input.
 *
 * Evaluation works row by row: every leaf writes one row of 64-bit words
 * with interval fills, periodic word patterns or per-block caches, and inner
 * nodes combine rows with word-wise AND/OR. The cost per row is about the
 * number of words per row times the number of leaves (plus the set bits for
 * sparse random masks), never one predicate call per element.
 */
#include "internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPEC_MAX_SEQ 1048576
#define SPEC_MAX_DEPTH 64
/* Integer parameters above this behave exactly like this value for every
 * allowed size (2^20), so they are clamped to keep the arithmetic in range. */
#define SPEC_PARAM_CLAMP ((uint64_t)1 << 21)

/* ------------------------------------------------------------------------ */
/* Leaves                                                                    */
/* ------------------------------------------------------------------------ */

enum leaf_kind {
    LEAF_DENSE,
    LEAF_NONE,
    LEAF_CAUSAL,
    LEAF_SLIDING,
    LEAF_CAUSAL_SLIDING,
    LEAF_DILATED,
    LEAF_LONGFORMER,
    LEAF_BIGBIRD,
    LEAF_STRIDED,
    LEAF_RANDOM
};

enum param_type {
    PARAM_POSITIVE, /* integer >= 1 */
    PARAM_COUNT,    /* integer >= 0 */
    PARAM_SEED,     /* any unsigned 64-bit integer */
    PARAM_PROB      /* decimal in [0, 1] */
};

#define LEAF_MAX_PARAMS 5

typedef struct leaf_def {
    const char *name;
    enum leaf_kind kind;
    int n_params;
    const char *param_names[LEAF_MAX_PARAMS];
    enum param_type param_types[LEAF_MAX_PARAMS];
} leaf_def;

static const leaf_def leaf_defs[] = {
    {"dense", LEAF_DENSE, 0, {0}, {0}},
    {"none", LEAF_NONE, 0, {0}, {0}},
    {"causal", LEAF_CAUSAL, 0, {0}, {0}},
    {"sliding", LEAF_SLIDING, 1, {"W"}, {PARAM_POSITIVE}},
    {"causal_sliding", LEAF_CAUSAL_SLIDING, 1, {"W"}, {PARAM_POSITIVE}},
    {"dilated", LEAF_DILATED, 2, {"W", "D"}, {PARAM_POSITIVE, PARAM_POSITIVE}},
    {"longformer", LEAF_LONGFORMER, 2, {"W", "G"},
     {PARAM_POSITIVE, PARAM_COUNT}},
    {"bigbird", LEAF_BIGBIRD, 5, {"B", "W", "G", "R", "SEED"},
     {PARAM_POSITIVE, PARAM_POSITIVE, PARAM_COUNT, PARAM_COUNT, PARAM_SEED}},
    {"strided", LEAF_STRIDED, 1, {"S"}, {PARAM_POSITIVE}},
    {"random", LEAF_RANDOM, 2, {"P", "SEED"}, {PARAM_PROB, PARAM_SEED}},
};

#define N_LEAF_DEFS ((int)(sizeof(leaf_defs) / sizeof(leaf_defs[0])))

static const char leaf_name_list[] =
    "dense, none, causal, sliding:W, causal_sliding:W, dilated:W:D, "
    "longformer:W:G, bigbird:B:W:G:R:SEED, strided:S, random:P:SEED";

/* ------------------------------------------------------------------------ */
/* Syntax tree                                                               */
/* ------------------------------------------------------------------------ */

enum node_op { OP_LEAF, OP_AND, OP_OR };

typedef struct node {
    enum node_op op;
    /* leaf */
    const leaf_def *def;
    uint64_t v[LEAF_MAX_PARAMS]; /* integer parameters (clamped, not SEED) */
    double prob;                 /* random's P */
    /* inner node */
    struct node **kids;
    int n_kids, cap_kids;
    /* evaluation state of a leaf (see leaf_prepare) */
    uint64_t *pat;     /* strided: the periodic row; dilated: word table */
    uint64_t *row;     /* bigbird: the row of the cached block row */
    uint64_t *seen;    /* bigbird: scratch bitset over column blocks */
    int64_t cached_block;
} node;

static void node_free(node *n)
{
    if (!n)
        return;
    for (int i = 0; i < n->n_kids; i++)
        node_free(n->kids[i]);
    free(n->kids);
    free(n->pat);
    free(n->row);
    free(n->seen);
    free(n);
}

/* ------------------------------------------------------------------------ */
/* Parser                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct parser {
    stof_context *ctx;
    const char *s;
    size_t pos;
    int depth;
    stof_status st; /* STOF_OK until the first error */
} parser;

/* Quote the spec for an error message: escape quotes, backslashes and
 * control bytes, and cut long specs. */
static void quote_spec(const char *s, char *buf, size_t n)
{
    size_t o = 0, i = 0;
    const size_t max_in = 160;
    for (; s[i] && i < max_in && o + 8 < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)c;
        } else if (c < 0x20 || c >= 0x7f) {
            o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
        } else {
            buf[o++] = (char)c;
        }
    }
    if (s[i] && o + 4 < n) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
}

/* Record an error at 0-based offset `at`; reported 1-based. Only the first
 * error is kept. Returns NULL for the convenience of the callers. */
static node *perr(parser *p, size_t at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static node *perr(parser *p, size_t at, const char *fmt, ...)
{
    if (p->st != STOF_OK)
        return NULL;
    char msg[1024], q[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    quote_spec(p->s, q, sizeof(q));
    p->st = stof__fail(p->ctx, STOF_ERR_INVALID_ARGUMENT,
                       "spec \"%s\" column %zu: %s", q, at + 1, msg);
    return NULL;
}

static node *poom(parser *p)
{
    if (p->st == STOF_OK)
        p->st = stof__fail(p->ctx, STOF_ERR_OUT_OF_MEMORY,
                           "out of memory parsing a mask spec");
    return NULL;
}

static void skip_ws(parser *p)
{
    while (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
           p->s[p->pos] == '\n' || p->s[p->pos] == '\r' ||
           p->s[p->pos] == '\f' || p->s[p->pos] == '\v')
        p->pos++;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           is_digit(c);
}

/* A printable rendering of the character at p->pos for messages. */
static const char *char_desc(const parser *p, char *buf, size_t n)
{
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c == '\0')
        snprintf(buf, n, "the end of the spec");
    else if (c == '\'')
        snprintf(buf, n, "\"'\"");
    else if (c < 0x20 || c >= 0x7f)
        snprintf(buf, n, "byte 0x%02x", c);
    else
        snprintf(buf, n, "'%c'", c);
    return buf;
}

static const char *param_expect(enum param_type t)
{
    switch (t) {
    case PARAM_POSITIVE:
        return "a positive integer";
    case PARAM_COUNT:
        return "a non-negative integer";
    case PARAM_SEED:
        return "an unsigned 64-bit integer";
    case PARAM_PROB:
        return "a decimal number from 0 to 1";
    }
    return "a value";
}

/* Parse an unsigned decimal integer at p->pos; 0 on success. */
static int parse_uint(parser *p, const leaf_def *d, int i, uint64_t *out)
{
    size_t start = p->pos;
    if (!is_digit(p->s[p->pos])) {
        char c[32];
        perr(p, start, "expected %s for %s of %s, found %s",
             param_expect(d->param_types[i]), d->param_names[i], d->name,
             char_desc(p, c, sizeof(c)));
        return -1;
    }
    uint64_t v = 0;
    while (is_digit(p->s[p->pos])) {
        unsigned dgt = (unsigned)(p->s[p->pos] - '0');
        if (v > (UINT64_MAX - dgt) / 10) {
            perr(p, start, "%s of %s does not fit in 64 bits",
                 d->param_names[i], d->name);
            return -1;
        }
        v = v * 10 + dgt;
        p->pos++;
    }
    *out = v;
    return 0;
}

/* Parse a decimal probability "1", "0.25", ".5" at p->pos. Done by hand so
 * the result does not depend on the process locale. */
static int parse_prob(parser *p, const leaf_def *d, int i, double *out)
{
    size_t start = p->pos;
    uint64_t mant = 0;
    int digits = 0, sig = 0, scale = 0; /* value = mant * 10^-scale */
    while (is_digit(p->s[p->pos])) {
        if (sig < 18) {
            mant = mant * 10 + (uint64_t)(p->s[p->pos] - '0');
            if (mant)
                sig++;
        } else {
            scale--; /* integer digit dropped: value is huge anyway */
        }
        digits++;
        p->pos++;
    }
    if (p->s[p->pos] == '.') {
        p->pos++;
        while (is_digit(p->s[p->pos])) {
            if (sig < 18) {
                mant = mant * 10 + (uint64_t)(p->s[p->pos] - '0');
                scale++;
                if (mant)
                    sig++;
            }
            digits++;
            p->pos++;
        }
    }
    if (digits == 0) {
        char c[32];
        p->pos = start;
        perr(p, start, "expected %s for %s of %s, found %s",
             param_expect(d->param_types[i]), d->param_names[i], d->name,
             char_desc(p, c, sizeof(c)));
        return -1;
    }
    double v = (double)mant;
    if (scale > 0)
        v /= pow(10.0, (double)scale);
    else if (scale < 0)
        v *= pow(10.0, (double)-scale);
    if (!(v >= 0.0 && v <= 1.0)) {
        perr(p, start, "%s of %s must be from 0 to 1, got %.*s",
             d->param_names[i], d->name, (int)(p->pos - start > 40 ? 40
                                                   : p->pos - start),
             p->s + start);
        return -1;
    }
    *out = v;
    return 0;
}

static node *node_new(parser *p, enum node_op op)
{
    node *n = calloc(1, sizeof(*n));
    if (!n)
        return poom(p);
    n->op = op;
    n->cached_block = -1;
    return n;
}

static int node_add(parser *p, node *n, node *kid)
{
    if (n->n_kids == n->cap_kids) {
        int cap = n->cap_kids ? 2 * n->cap_kids : 4;
        node **k = realloc(n->kids, (size_t)cap * sizeof(*k));
        if (!k) {
            poom(p);
            return -1;
        }
        n->kids = k;
        n->cap_kids = cap;
    }
    n->kids[n->n_kids++] = kid;
    return 0;
}

static node *parse_leaf(parser *p)
{
    size_t start = p->pos;
    while (is_name_char(p->s[p->pos]))
        p->pos++;
    size_t len = p->pos - start;
    const leaf_def *d = NULL;
    for (int i = 0; i < N_LEAF_DEFS; i++) {
        if (strlen(leaf_defs[i].name) == len &&
            memcmp(leaf_defs[i].name, p->s + start, len) == 0) {
            d = &leaf_defs[i];
            break;
        }
    }
    if (!d)
        return perr(p, start, "unknown mask \"%.*s\"; expected one of %s",
                    (int)(len > 40 ? 40 : len), p->s + start, leaf_name_list);
    node *n = node_new(p, OP_LEAF);
    if (!n)
        return NULL;
    n->def = d;
    for (int i = 0; i < d->n_params; i++) {
        skip_ws(p);
        if (p->s[p->pos] != ':') {
            char c[32];
            perr(p, p->pos, "expected ':' and %s for %s of %s, found %s",
                 param_expect(d->param_types[i]), d->param_names[i], d->name,
                 char_desc(p, c, sizeof(c)));
            node_free(n);
            return NULL;
        }
        p->pos++;
        skip_ws(p);
        size_t vstart = p->pos;
        int rc;
        if (d->param_types[i] == PARAM_PROB) {
            rc = parse_prob(p, d, i, &n->prob);
        } else {
            uint64_t v = 0;
            rc = parse_uint(p, d, i, &v);
            if (rc == 0 && d->param_types[i] == PARAM_POSITIVE && v == 0) {
                perr(p, vstart, "expected a positive integer for %s of %s, "
                                "got 0",
                     d->param_names[i], d->name);
                rc = -1;
            }
            if (rc == 0 && d->param_types[i] != PARAM_SEED &&
                v > SPEC_PARAM_CLAMP)
                v = SPEC_PARAM_CLAMP;
            n->v[i] = v;
        }
        if (rc == 0 && (is_name_char(p->s[p->pos]) || p->s[p->pos] == '.')) {
            char c[32];
            perr(p, p->pos, "unexpected %s after %s of %s; expected %s",
                 char_desc(p, c, sizeof(c)), d->param_names[i], d->name,
                 param_expect(d->param_types[i]));
            rc = -1;
        }
        if (rc != 0) {
            node_free(n);
            return NULL;
        }
    }
    skip_ws(p);
    if (p->s[p->pos] == ':') {
        if (d->n_params == 0)
            perr(p, p->pos, "%s takes no parameters; unexpected ':'", d->name);
        else
            perr(p, p->pos, "%s takes %d parameter%s; unexpected ':'", d->name,
                 d->n_params, d->n_params == 1 ? "" : "s");
        node_free(n);
        return NULL;
    }
    return n;
}

static node *parse_expr(parser *p);

static node *parse_factor(parser *p)
{
    skip_ws(p);
    char c = p->s[p->pos];
    if (c == '(') {
        size_t open = p->pos;
        if (p->depth >= SPEC_MAX_DEPTH)
            return perr(p, open, "parentheses nested deeper than %d",
                        SPEC_MAX_DEPTH);
        p->depth++;
        p->pos++;
        node *n = parse_expr(p);
        if (!n)
            return NULL;
        skip_ws(p);
        if (p->s[p->pos] != ')') {
            char d[32];
            node_free(n);
            if (p->s[p->pos] == '\0')
                return perr(p, p->pos, "missing ')' for the '(' at column %zu",
                            open + 1);
            return perr(p, p->pos, "unexpected %s; expected '&', '|' or ')' "
                                   "closing the '(' at column %zu",
                        char_desc(p, d, sizeof(d)), open + 1);
        }
        p->pos++;
        p->depth--;
        return n;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
        return parse_leaf(p);
    char d[32];
    return perr(p, p->pos, "expected a mask name or '(', found %s",
                char_desc(p, d, sizeof(d)));
}

/* One level of the grammar: operands separated by `sep`, made of `sub`. */
static node *parse_list(parser *p, char sep, enum node_op op,
                        node *(*sub)(parser *))
{
    node *first = sub(p);
    if (!first)
        return NULL;
    skip_ws(p);
    if (p->s[p->pos] != sep)
        return first;
    node *n = node_new(p, op);
    if (!n || node_add(p, n, first) != 0) {
        node_free(n);
        node_free(first);
        return NULL;
    }
    while (p->s[p->pos] == sep) {
        p->pos++;
        node *k = sub(p);
        if (!k || node_add(p, n, k) != 0) {
            node_free(k);
            node_free(n);
            return NULL;
        }
        skip_ws(p);
    }
    return n;
}

static node *parse_term(parser *p)
{
    return parse_list(p, '&', OP_AND, parse_factor);
}

static node *parse_expr(parser *p)
{
    return parse_list(p, '|', OP_OR, parse_term);
}

static node *parse_spec(parser *p)
{
    skip_ws(p);
    if (p->s[p->pos] == '\0')
        return perr(p, p->pos, "empty spec; expected a mask such as "
                               "\"causal\" or \"sliding:256\" (one of %s)",
                    leaf_name_list);
    node *n = parse_expr(p);
    if (!n)
        return NULL;
    skip_ws(p);
    if (p->s[p->pos] != '\0') {
        char d[32];
        if (p->s[p->pos] == ')')
            perr(p, p->pos, "unmatched ')'");
        else
            perr(p, p->pos, "unexpected %s; expected '&', '|' or the end of "
                            "the spec",
                 char_desc(p, d, sizeof(d)));
        node_free(n);
        return NULL;
    }
    return n;
}

/* The number of inner levels below and including n (a leaf has 0). */
static int node_height(const node *n)
{
    if (n->op == OP_LEAF)
        return 0;
    int h = 0;
    for (int i = 0; i < n->n_kids; i++) {
        int k = node_height(n->kids[i]);
        if (k > h)
            h = k;
    }
    return h + 1;
}

/* ------------------------------------------------------------------------ */
/* Row evaluation                                                            */
/* ------------------------------------------------------------------------ */

typedef struct eval_env {
    int64_t seq_q, seq_k;
    int wpr;
    uint64_t last_mask; /* valid bits of the last word of a row */
} eval_env;

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A well-mixed 64-bit value of x (the splitmix64 finaliser). */
static uint64_t mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Set bits [lo, hi) of a row; the range is clipped to [0, seq_k). */
static void set_range(uint64_t *row, int64_t lo, int64_t hi, const eval_env *e)
{
    if (lo < 0)
        lo = 0;
    if (hi > e->seq_k)
        hi = e->seq_k;
    if (lo >= hi)
        return;
    int64_t wlo = lo >> 6, whi = (hi - 1) >> 6;
    uint64_t mlo = ~0ull << (lo & 63);
    uint64_t mhi = ~0ull >> (63 - ((hi - 1) & 63));
    if (wlo == whi) {
        row[wlo] |= mlo & mhi;
        return;
    }
    row[wlo] |= mlo;
    for (int64_t w = wlo + 1; w < whi; w++)
        row[w] = ~0ull;
    row[whi] |= mhi;
}

static void set_full(uint64_t *row, const eval_env *e)
{
    memset(row, 0xff, (size_t)e->wpr * sizeof(uint64_t));
    row[e->wpr - 1] = e->last_mask;
}

/* Allocate and precompute a leaf's evaluation state. 0 on success. */
static int leaf_prepare(node *n, const eval_env *e)
{
    switch (n->def->kind) {
    case LEAF_STRIDED: {
        /* Columns with k % S == S-1, the same in every row. */
        n->pat = calloc((size_t)e->wpr, sizeof(uint64_t));
        if (!n->pat)
            return -1;
        int64_t s = (int64_t)n->v[0];
        for (int64_t k = s - 1; k < e->seq_k; k += s)
            n->pat[k >> 6] |= 1ull << (k & 63);
        return 0;
    }
    case LEAF_DILATED: {
        /* For D <= 64, pat[r] holds the bits b of a word with
         * (r + b) % D == 0: word w of row q is pat[(64w - q) mod D]. */
        int64_t d = (int64_t)n->v[1];
        if (d > 64)
            return 0;
        n->pat = calloc((size_t)d, sizeof(uint64_t));
        if (!n->pat)
            return -1;
        for (int64_t r = 0; r < d; r++)
            for (int64_t b = (d - r % d) % d; b < 64; b += d)
                n->pat[r] |= 1ull << b;
        return 0;
    }
    case LEAF_BIGBIRD: {
        int64_t b = (int64_t)n->v[0];
        int64_t nbk = (e->seq_k + b - 1) / b;
        n->row = malloc((size_t)e->wpr * sizeof(uint64_t));
        n->seen = calloc((size_t)((nbk + 63) / 64), sizeof(uint64_t));
        n->cached_block = -1;
        return n->row && n->seen ? 0 : -1;
    }
    default:
        return 0;
    }
}

static int leaf_prepare_all(node *n, const eval_env *e)
{
    if (n->op == OP_LEAF)
        return leaf_prepare(n, e);
    for (int i = 0; i < n->n_kids; i++)
        if (leaf_prepare_all(n->kids[i], e) != 0)
            return -1;
    return 0;
}

/* Bits k of row q with |q-k| < W and (q-k) % D == 0. */
static void dilated_row(const node *n, int64_t q, uint64_t *row,
                        const eval_env *e)
{
    int64_t w = (int64_t)n->v[0], d = (int64_t)n->v[1];
    int64_t lo = q - w + 1, hi = q + w;
    if (lo < 0)
        lo = 0;
    if (hi > e->seq_k)
        hi = e->seq_k;
    if (lo >= hi)
        return;
    if (d == 1) {
        set_range(row, lo, hi, e);
        return;
    }
    if (!n->pat) {
        /* D > 64: at most one bit per word, set them one by one. */
        int64_t k = q - ((q - lo) / d) * d;
        for (; k < hi; k += d)
            row[k >> 6] |= 1ull << (k & 63);
        return;
    }
    int64_t wlo = lo >> 6, whi = (hi - 1) >> 6;
    int64_t r = ((64 * wlo - q) % d + d) % d;
    int64_t step = 64 % d;
    for (int64_t wi = wlo; wi <= whi; wi++) {
        uint64_t m = n->pat[r];
        if (wi == wlo)
            m &= ~0ull << (lo & 63);
        if (wi == whi)
            m &= ~0ull >> (63 - ((hi - 1) & 63));
        row[wi] = m;
        r += step;
        if (r >= d)
            r -= d;
    }
}

/* The row shared by every query of bigbird block row i (see stof.h). */
static void bigbird_block_row(node *n, int64_t i, const eval_env *e)
{
    int64_t b = (int64_t)n->v[0], w = (int64_t)n->v[1], g = (int64_t)n->v[2];
    int64_t r = (int64_t)n->v[3];
    uint64_t seed = n->v[4];
    int64_t nbk = (e->seq_k + b - 1) / b;
    uint64_t *row = n->row;
    memset(row, 0, (size_t)e->wpr * sizeof(uint64_t));
    if (i < g || r >= nbk) {
        set_full(row, e);
        return;
    }
    set_range(row, 0, g * b, e);
    int64_t jlo = i - (w - 1) / 2, jhi = i + w / 2;
    if (jlo < 0)
        jlo = 0;
    if (jhi > nbk - 1)
        jhi = nbk - 1;
    if (jlo <= jhi)
        set_range(row, jlo * b, (jhi + 1) * b, e);
    if (r == 0)
        return;
    /* R distinct block columns by Floyd's algorithm, from a generator that
     * depends only on SEED and i, so every size agrees on the choice. */
    uint64_t s = seed ^ mix64((uint64_t)i + 0x632be59bd9b4e019ull);
    for (int64_t j = nbk - r; j < nbk; j++) {
        int64_t t = (int64_t)(splitmix64(&s) % (uint64_t)(j + 1));
        if (n->seen[t >> 6] & (1ull << (t & 63)))
            t = j;
        n->seen[t >> 6] |= 1ull << (t & 63);
        set_range(row, t * b, (t + 1) * b, e);
    }
    /* Clear only the words touched, so the cost stays O(R). */
    s = seed ^ mix64((uint64_t)i + 0x632be59bd9b4e019ull);
    for (int64_t j = nbk - r; j < nbk; j++) {
        int64_t t = (int64_t)(splitmix64(&s) % (uint64_t)(j + 1));
        n->seen[t >> 6] = 0;
        n->seen[j >> 6] = 0;
    }
}

/* OR into row the elements of a Bernoulli(p) row, found by skipping
 * geometric gaps: the cost is one draw per kept element. */
static void random_sparse(double p, uint64_t *s, uint64_t *row,
                          const eval_env *e)
{
    const double inv = 1.0 / log1p(-p);
    double k = -1.0;
    for (;;) {
        /* u in (0, 1]; gap = failures before the next success. */
        double u = ((double)(splitmix64(s) >> 11) + 1.0) *
                   (1.0 / 9007199254740992.0);
        k += floor(log(u) * inv) + 1.0;
        if (k >= (double)e->seq_k)
            break;
        int64_t ki = (int64_t)k;
        row[ki >> 6] |= 1ull << (ki & 63);
    }
}

/* Each element of row q kept with probability P, from a generator seeded by
 * SEED and q (so a row does not depend on the others). For P > 1/2 the
 * complement is drawn with 1 - P. Then P = a + (1 - a) r with a = P rounded
 * down to 10 binary digits: whole words with bit probability a come from
 * one random word per binary digit of a (an AND/OR cascade), and the
 * remainder r < 1/512 is ORed in by geometric skipping. Tiny P uses the
 * skipping alone. The result is exactly Bernoulli(P) per element. */
static void random_row(const node *n, int64_t q, uint64_t *row,
                       const eval_env *e)
{
    double p = n->prob;
    if (p <= 0.0)
        return;
    if (p >= 1.0) {
        set_full(row, e);
        return;
    }
    const int invert = p > 0.5;
    if (invert)
        p = 1.0 - p;
    uint64_t s = mix64(n->v[1] ^ mix64((uint64_t)q + 0x2545f4914f6cdd1dull));
    double r = p;
    if (p >= 1.0 / 256.0) {
        const unsigned a10 = (unsigned)(p * 1024.0); /* 4..512 */
        const double a = (double)a10 / 1024.0;
        r = (p - a) / (1.0 - a);
        const int first = __builtin_ctz(a10);
        for (int w = 0; w < e->wpr; w++) {
            uint64_t x = 0;
            for (int b = first; b < 10; b++) {
                uint64_t y = splitmix64(&s);
                x = ((a10 >> b) & 1u) ? (x | y) : (x & y);
            }
            row[w] = x;
        }
    }
    if (r > 0.0)
        random_sparse(r, &s, row, e);
    if (invert)
        for (int w = 0; w < e->wpr; w++)
            row[w] = ~row[w];
    row[e->wpr - 1] &= e->last_mask;
}

/* Write row q of a leaf into `row` (all words are written). */
static void leaf_row(node *n, int64_t q, uint64_t *row, const eval_env *e)
{
    int64_t v0 = (int64_t)n->v[0];
    switch (n->def->kind) {
    case LEAF_STRIDED:
        memcpy(row, n->pat, (size_t)e->wpr * sizeof(uint64_t));
        set_range(row, q - v0 + 1, q + v0, e);
        return;
    case LEAF_BIGBIRD: {
        int64_t i = q / v0;
        if (n->cached_block != i) {
            bigbird_block_row(n, i, e);
            n->cached_block = i;
        }
        memcpy(row, n->row, (size_t)e->wpr * sizeof(uint64_t));
        return;
    }
    default:
        break;
    }
    memset(row, 0, (size_t)e->wpr * sizeof(uint64_t));
    switch (n->def->kind) {
    case LEAF_DENSE:
        set_full(row, e);
        break;
    case LEAF_NONE:
        break;
    case LEAF_CAUSAL:
        set_range(row, 0, q + 1, e);
        break;
    case LEAF_SLIDING:
        set_range(row, q - v0 + 1, q + v0, e);
        break;
    case LEAF_CAUSAL_SLIDING:
        set_range(row, q - v0 + 1, q + 1, e);
        break;
    case LEAF_DILATED:
        dilated_row(n, q, row, e);
        break;
    case LEAF_LONGFORMER:
        if (q < (int64_t)n->v[1]) {
            set_full(row, e);
        } else {
            set_range(row, q - v0 + 1, q + v0, e);
            set_range(row, 0, (int64_t)n->v[1], e);
        }
        break;
    case LEAF_RANDOM:
        random_row(n, q, row, e);
        break;
    case LEAF_STRIDED:
    case LEAF_BIGBIRD:
        break; /* handled above */
    }
}

/* Write row q of the subtree n into out; tmp[level..] are scratch rows. */
static void eval_row(node *n, int64_t q, uint64_t *out, uint64_t **tmp,
                     int level, const eval_env *e)
{
    if (n->op == OP_LEAF) {
        leaf_row(n, q, out, e);
        return;
    }
    eval_row(n->kids[0], q, out, tmp, level + 1, e);
    uint64_t *t = tmp[level];
    for (int i = 1; i < n->n_kids; i++) {
        eval_row(n->kids[i], q, t, tmp, level + 1, e);
        if (n->op == OP_AND)
            for (int w = 0; w < e->wpr; w++)
                out[w] &= t[w];
        else
            for (int w = 0; w < e->wpr; w++)
                out[w] |= t[w];
    }
}

/* ------------------------------------------------------------------------ */
/* Entry point                                                               */
/* ------------------------------------------------------------------------ */

stof_status stof_mask_from_spec(stof_context *ctx, const char *spec, int seq_q,
                                int seq_k, stof_mask **mask)
{
    STOF_CHECK_ARG(ctx, mask != NULL, "stof_mask_from_spec: mask is NULL");
    *mask = NULL;
    STOF_CHECK_ARG(ctx, spec != NULL, "stof_mask_from_spec: spec is NULL");
    STOF_CHECK_ARG(ctx, seq_q >= 1 && seq_q <= SPEC_MAX_SEQ,
                   "stof_mask_from_spec: seq_q = %d, expected 1..%d", seq_q,
                   SPEC_MAX_SEQ);
    STOF_CHECK_ARG(ctx, seq_k >= 1 && seq_k <= SPEC_MAX_SEQ,
                   "stof_mask_from_spec: seq_k = %d, expected 1..%d", seq_k,
                   SPEC_MAX_SEQ);

    parser p = {ctx, spec, 0, 0, STOF_OK};
    node *root = parse_spec(&p);
    if (!root)
        return p.st != STOF_OK ? p.st
                               : stof__fail(ctx, STOF_ERR_INTERNAL,
                                            "mask spec parser failed");

    stof_mask *m = NULL;
    stof_status st = stof__mask_alloc(ctx, seq_q, seq_k, &m);
    if (st != STOF_OK) {
        node_free(root);
        return st;
    }
    eval_env e;
    e.seq_q = seq_q;
    e.seq_k = seq_k;
    e.wpr = m->words_per_row;
    e.last_mask = (seq_k % 64) ? (~0ull >> (64 - seq_k % 64)) : ~0ull;

    int height = node_height(root);
    uint64_t **tmp = calloc((size_t)height + 1, sizeof(*tmp));
    int ok = tmp != NULL && leaf_prepare_all(root, &e) == 0;
    for (int i = 0; ok && i < height; i++) {
        tmp[i] = malloc((size_t)e.wpr * sizeof(uint64_t));
        ok = tmp[i] != NULL;
    }
    if (ok) {
        for (int64_t q = 0; q < seq_q; q++)
            eval_row(root, q, m->bits + q * e.wpr, tmp, 0, &e);
        stof__mask_recount(m);
    }
    if (tmp)
        for (int i = 0; i < height; i++)
            free(tmp[i]);
    free(tmp);
    node_free(root);
    /* The spec is kept so that tuning records can be rebuilt from it
     * (stof-tune verify / pending); a long one is not kept. */
    if (ok && strlen(spec) < STOF_MASK_SPEC_MAX)
        ok = (m->spec = strdup(spec)) != NULL;
    if (!ok) {
        stof_mask_free(&m);
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory evaluating mask spec \"%.100s\"",
                          spec);
    }
    *mask = m;
    return stof__ok(ctx);
}
