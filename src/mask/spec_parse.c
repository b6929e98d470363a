/*
 * spec_parse.c - the mask spec language: a recursive-descent parser that
 * builds a small syntax tree (spec.h), and its canonical text.
 *
 * Grammar (whitespace between tokens is ignored):
 *
 *     expr   := term ('|' term)*
 *     term   := factor ('&' factor)*
 *     factor := '!' factor | '(' expr ')' | leaf
 *     leaf   := NAME (':' PARAM)*
 *
 * Unions and intersections are n-ary nodes, so a long chain "a|b|c|..." is
 * one wide node and the tree height is bounded by the nesting of
 * parentheses and negations (at most SPEC_MAX_DEPTH): neither the parser
 * nor the evaluator can be driven into deep recursion by any input.
 */
#include "spec.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPEC_MAX_DEPTH 64
/* Integer parameters above this behave exactly like this value: keys are
 * at most 2^20, query positions at most 2^30 + 2^20 (a family's q_offset,
 * stof_mask_data, plus the rows), so no window, count, block or stride
 * beyond it changes a mask. They are clamped to keep the arithmetic (and
 * the GPU program's 32-bit parameters) in range. */
#define SPEC_PARAM_CLAMP (((uint64_t)1 << 30) + ((uint64_t)1 << 21))

/* ------------------------------------------------------------------------ */
/* Leaves                                                                    */
/* ------------------------------------------------------------------------ */

enum param_type {
    PARAM_POSITIVE, /* integer >= 1 */
    PARAM_COUNT,    /* integer >= 0 */
    PARAM_SEED,     /* any unsigned 64-bit integer */
    PARAM_PROB      /* decimal in [0, 1] */
};

typedef struct leaf_def {
    const char *name;
    enum stof_leaf_kind kind;
    int min_params, n_params; /* parameters past min_params are optional */
    const char *param_names[STOF_SPEC_MAX_PARAMS];
    enum param_type param_types[STOF_SPEC_MAX_PARAMS];
} leaf_def;

static const leaf_def leaf_defs[] = {
    {"dense", STOF_LEAF_DENSE, 0, 0, {0}, {0}},
    {"none", STOF_LEAF_NONE, 0, 0, {0}, {0}},
    {"causal", STOF_LEAF_CAUSAL, 0, 0, {0}, {0}},
    {"sliding", STOF_LEAF_SLIDING, 1, 1, {"W"}, {PARAM_POSITIVE}},
    {"causal_sliding", STOF_LEAF_CAUSAL_SLIDING, 1, 1, {"W"},
     {PARAM_POSITIVE}},
    {"dilated", STOF_LEAF_DILATED, 2, 2, {"W", "D"},
     {PARAM_POSITIVE, PARAM_POSITIVE}},
    {"longformer", STOF_LEAF_LONGFORMER, 2, 2, {"W", "G"},
     {PARAM_POSITIVE, PARAM_COUNT}},
    {"bigbird", STOF_LEAF_BIGBIRD, 5, 5, {"B", "W", "G", "R", "SEED"},
     {PARAM_POSITIVE, PARAM_POSITIVE, PARAM_COUNT, PARAM_COUNT, PARAM_SEED}},
    {"strided", STOF_LEAF_STRIDED, 1, 1, {"S"}, {PARAM_POSITIVE}},
    {"random", STOF_LEAF_RANDOM, 2, 2, {"P", "SEED"}, {PARAM_PROB, PARAM_SEED}},
    {"docs", STOF_LEAF_DOCS, 0, 0, {0}, {0}},
    {"prefix", STOF_LEAF_PREFIX, 0, 1, {"P"}, {PARAM_COUNT}},
    {"bitmap", STOF_LEAF_BITMAP, 0, 0, {0}, {0}},
    {"head_sliding", STOF_LEAF_HEAD_SLIDING, 0, 0, {0}, {0}},
    {"head_causal_sliding", STOF_LEAF_HEAD_CAUSAL_SLIDING, 0, 0, {0}, {0}},
};

#define N_LEAF_DEFS ((int)(sizeof(leaf_defs) / sizeof(leaf_defs[0])))

const char stof__spec_leaf_names[] =
    "dense, none, causal, sliding:W, causal_sliding:W, dilated:W:D, "
    "longformer:W:G, bigbird:B:W:G:R:SEED, strided:S, random:P:SEED, docs, "
    "prefix, prefix:P, bitmap, head_sliding, head_causal_sliding";

/* ------------------------------------------------------------------------ */
/* Syntax tree                                                               */
/* ------------------------------------------------------------------------ */

typedef stof_spec_node node;

static void node_free(node *n)
{
    if (!n)
        return;
    for (int i = 0; i < n->n_kids; i++)
        node_free(n->kids[i]);
    free(n->kids);
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
static int parse_prob(parser *p, const leaf_def *d, int i, node *n)
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
    /* The decimal as read, without trailing zeros: the canonical text
     * prints exactly these digits, so it parses back to the same value. */
    while (mant && mant % 10 == 0 && scale > 0) {
        mant /= 10;
        scale--;
    }
    if (!mant)
        scale = 0;
    n->prob = v;
    n->prob_mant = mant;
    n->prob_scale = scale;
    return 0;
}

static node *node_new(parser *p, enum stof_spec_op op)
{
    node *n = calloc(1, sizeof(*n));
    if (!n)
        return poom(p);
    n->op = op;
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
                    (int)(len > 40 ? 40 : len), p->s + start, stof__spec_leaf_names);
    node *n = node_new(p, STOF_SPEC_LEAF);
    if (!n)
        return NULL;
    n->kind = d->kind;
    n->name = d->name;
    for (int i = 0; i < d->n_params; i++) {
        skip_ws(p);
        if (p->s[p->pos] != ':' && i >= d->min_params)
            break; /* the optional parameters are left out */
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
            rc = parse_prob(p, d, i, n);
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
        n->n_params = i + 1;
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
        else if (d->min_params < d->n_params)
            perr(p, p->pos, "%s takes at most %d parameter%s; unexpected ':'",
                 d->name, d->n_params, d->n_params == 1 ? "" : "s");
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
    if (c == '!') {
        size_t at = p->pos;
        if (p->depth >= SPEC_MAX_DEPTH)
            return perr(p, at, "negations and parentheses nested deeper "
                               "than %d",
                        SPEC_MAX_DEPTH);
        p->depth++;
        p->pos++;
        node *kid = parse_factor(p);
        if (!kid)
            return NULL;
        p->depth--;
        node *n = node_new(p, STOF_SPEC_NOT);
        if (!n || node_add(p, n, kid) != 0) {
            node_free(n);
            node_free(kid);
            return NULL;
        }
        return n;
    }
    if (c == '(') {
        size_t open = p->pos;
        if (p->depth >= SPEC_MAX_DEPTH)
            return perr(p, open, "negations and parentheses nested deeper "
                                 "than %d",
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
    return perr(p, p->pos, "expected a mask name, '!' or '(', found %s",
                char_desc(p, d, sizeof(d)));
}

/* One level of the grammar: operands separated by `sep`, made of `sub`. */
static node *parse_list(parser *p, char sep, enum stof_spec_op op,
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
    return parse_list(p, '&', STOF_SPEC_AND, parse_factor);
}

static node *parse_expr(parser *p)
{
    return parse_list(p, '|', STOF_SPEC_OR, parse_term);
}

static node *parse_spec(parser *p)
{
    skip_ws(p);
    if (p->s[p->pos] == '\0')
        return perr(p, p->pos, "empty spec; expected a mask such as "
                               "\"causal\" or \"sliding:256\" (one of %s)",
                    stof__spec_leaf_names);
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
/* ------------------------------------------------------------------------ */
/* The parsed spec                                                           */
/* ------------------------------------------------------------------------ */

/* Number the leaves, and find the height and the uses of instance data. */
static int walk(node *n, stof_spec *s)
{
    if (n->op == STOF_SPEC_LEAF) {
        n->leaf_id = s->n_leaves++;
        if (n->kind == STOF_LEAF_DOCS)
            s->uses |= STOF_SPEC_USES_DOCS;
        if (n->kind == STOF_LEAF_PREFIX && n->n_params == 0)
            s->uses |= STOF_SPEC_USES_PREFIX;
        if (n->kind == STOF_LEAF_BITMAP)
            s->uses |= STOF_SPEC_USES_BITMAP;
        if (n->kind == STOF_LEAF_HEAD_SLIDING ||
            n->kind == STOF_LEAF_HEAD_CAUSAL_SLIDING)
            s->uses |= STOF_SPEC_USES_HEAD;
        if (n->kind == STOF_LEAF_RANDOM || n->kind == STOF_LEAF_BIGBIRD)
            s->uses |= STOF_SPEC_USES_SEED;
        return 0;
    }
    if (n->op == STOF_SPEC_NOT)
        s->uses |= STOF_SPEC_USES_NOT;
    int h = 0;
    for (int i = 0; i < n->n_kids; i++) {
        int k = walk(n->kids[i], s);
        if (k > h)
            h = k;
    }
    return h + 1;
}

stof_status stof__spec_parse(stof_context *ctx, const char *text,
                             stof_spec **out)
{
    *out = NULL;
    parser p = {ctx, text, 0, 0, STOF_OK};
    node *root = parse_spec(&p);
    if (!root)
        return p.st != STOF_OK ? p.st
                               : stof__fail(ctx, STOF_ERR_INTERNAL,
                                            "mask spec parser failed");
    stof_spec *s = calloc(1, sizeof(*s));
    if (!s) {
        node_free(root);
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory parsing a mask spec");
    }
    s->root = root;
    s->height = walk(root, s);
    *out = s;
    return STOF_OK;
}

void stof__spec_free(stof_spec **s)
{
    if (!s || !*s)
        return;
    node_free((*s)->root);
    free(*s);
    *s = NULL;
}

/* Canonical text: appends to buf[n] at *o (counting past n). */
static void put(char *buf, size_t n, size_t *o, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static void put(char *buf, size_t n, size_t *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(*o < n ? buf + *o : NULL, *o < n ? n - *o : 0, fmt, ap);
    va_end(ap);
    if (k > 0)
        *o += (size_t)k;
}

/* ":" and mant * 10^-scale in positional notation (no exponent). */
static void put_decimal(char *buf, size_t n, size_t *o, uint64_t mant,
                        int scale)
{
    char d[32];
    int len = snprintf(d, sizeof(d), "%llu", (unsigned long long)mant);
    if (scale <= 0) {
        put(buf, n, o, ":%s", d);
    } else if (len <= scale) {
        put(buf, n, o, ":0.");
        for (int z = 0; z < scale - len; z++)
            put(buf, n, o, "0");
        put(buf, n, o, "%s", d);
    } else {
        put(buf, n, o, ":%.*s.%s", len - scale, d, d + len - scale);
    }
}

static void canon(const node *n, char *buf, size_t cap, size_t *o)
{
    switch (n->op) {
    case STOF_SPEC_LEAF:
        put(buf, cap, o, "%s", n->name);
        for (int i = 0; i < n->n_params; i++) {
            if (n->kind == STOF_LEAF_RANDOM && i == 0)
                put_decimal(buf, cap, o, n->prob_mant, n->prob_scale);
            else
                put(buf, cap, o, ":%llu", (unsigned long long)n->v[i]);
        }
        return;
    case STOF_SPEC_NOT: {
        const node *k = n->kids[0];
        int paren = k->op == STOF_SPEC_AND || k->op == STOF_SPEC_OR;
        put(buf, cap, o, paren ? "!(" : "!");
        canon(k, buf, cap, o);
        if (paren)
            put(buf, cap, o, ")");
        return;
    }
    case STOF_SPEC_AND:
    case STOF_SPEC_OR:
        for (int i = 0; i < n->n_kids; i++) {
            const node *k = n->kids[i];
            /* An OR inside an AND needs parentheses; an AND inside an OR
             * does not (it binds tighter); a node inside one of its own
             * kind was written with parentheses and keeps them. */
            int paren = k->op == STOF_SPEC_OR ||
                        (k->op == STOF_SPEC_AND && n->op == STOF_SPEC_AND);
            if (i)
                put(buf, cap, o, n->op == STOF_SPEC_AND ? "&" : "|");
            if (paren)
                put(buf, cap, o, "(");
            canon(k, buf, cap, o);
            if (paren)
                put(buf, cap, o, ")");
        }
        return;
    }
}

size_t stof__spec_canonical(const stof_spec *s, char *buf, size_t n)
{
    size_t o = 0;
    if (n > 0)
        buf[0] = '\0';
    canon(s->root, buf, n, &o);
    if (n > 0 && o >= n)
        buf[n - 1] = '\0';
    return o;
}

/* ------------------------------------------------------------------------ */
/* The program of the GPU format builder                                     */
/* ------------------------------------------------------------------------ */

static int emit(const node *n, int32_t *prog, int cap, int *len, int depth,
                int *max_depth)
{
    if (n->op == STOF_SPEC_LEAF) {
        int32_t a = 0, b = 0;
        switch (n->kind) {
        case STOF_LEAF_RANDOM:
            return -1; /* a sequential generator per row: the CPU's */
        case STOF_LEAF_BIGBIRD: {
            /* Three nodes: the leaf and its two parameter nodes. */
            if (n->v[3] > STOF_PROG_MAX_RANDOM || *len + 3 > cap)
                return -1;
            int32_t *o = prog + 4 * *len;
            const int32_t nodes[12] = {
                STOF_PROG_LEAF,  (int32_t)n->kind,  (int32_t)n->v[0],
                (int32_t)n->v[1], STOF_PROG_PARAM,  (int32_t)n->v[2],
                (int32_t)n->v[3], 0,                STOF_PROG_PARAM,
                (int32_t)(uint32_t)n->v[4], (int32_t)(uint32_t)(n->v[4] >> 32),
                0};
            memcpy(o, nodes, sizeof(nodes));
            *len += 3;
            if (depth + 1 > *max_depth)
                *max_depth = depth + 1;
            return 0;
        }
        case STOF_LEAF_SLIDING:
        case STOF_LEAF_CAUSAL_SLIDING:
        case STOF_LEAF_STRIDED:
            a = (int32_t)n->v[0];
            break;
        case STOF_LEAF_DILATED:
        case STOF_LEAF_LONGFORMER:
            a = (int32_t)n->v[0];
            b = (int32_t)n->v[1];
            break;
        case STOF_LEAF_PREFIX:
            b = n->n_params ? (int32_t)n->v[0] : -1;
            break;
        default:
            break;
        }
        if (*len >= cap)
            return -1;
        int32_t *o = prog + 4 * *len;
        o[0] = STOF_PROG_LEAF;
        o[1] = (int32_t)n->kind;
        o[2] = a;
        o[3] = b;
        (*len)++;
        if (depth + 1 > *max_depth)
            *max_depth = depth + 1;
        return 0;
    }
    for (int i = 0; i < n->n_kids; i++)
        if (emit(n->kids[i], prog, cap, len, depth + i, max_depth) != 0)
            return -1;
    if (*len >= cap)
        return -1;
    int32_t *o = prog + 4 * *len;
    o[0] = n->op == STOF_SPEC_NOT   ? STOF_PROG_NOT
           : n->op == STOF_SPEC_AND ? STOF_PROG_AND
                                    : STOF_PROG_OR;
    o[1] = n->op == STOF_SPEC_NOT ? 0 : n->n_kids;
    o[2] = o[3] = 0;
    (*len)++;
    return 0;
}

int stof__spec_program(const stof_spec *s, int32_t *prog, int cap,
                       int *max_stack)
{
    int len = 0, depth = 0;
    if (emit(s->root, prog, cap, &len, 0, &depth) != 0)
        return -1;
    if (max_stack)
        *max_stack = depth;
    return len;
}
