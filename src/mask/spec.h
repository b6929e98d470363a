/*
 * spec.h - the mask spec language inside the library: the parsed tree
 * (spec_parse.c), its evaluation for one instance (spec_eval.c: rows or
 * windows of 64-bit words, and tile classification without looking at
 * elements), used by stof_mask_from_spec and by mask families (family.c).
 *
 * A spec describes a family of masks. Its leaves read positions, not row
 * indices: query row q of an instance sits at key position q + q_offset, so
 * `causal` is k <= q + q_offset (bottom-right alignment when q_offset =
 * seq_k - seq_q). Instance data (per sequence) fills the leaves that need
 * it: `docs` (document ids of the key positions), `prefix` (a prefix length),
 * `bitmap` (the sequence's own bits, by row) and the seeds of `random` and
 * `bigbird`.
 */
#ifndef STOF_MASK_SPEC_H
#define STOF_MASK_SPEC_H

#include "internal.h"

#define STOF_SPEC_MAX_SEQ 1048576
#define STOF_SPEC_MAX_PARAMS 5

enum stof_leaf_kind {
    STOF_LEAF_DENSE,
    STOF_LEAF_NONE,
    STOF_LEAF_CAUSAL,
    STOF_LEAF_SLIDING,
    STOF_LEAF_CAUSAL_SLIDING,
    STOF_LEAF_DILATED,
    STOF_LEAF_LONGFORMER,
    STOF_LEAF_BIGBIRD,
    STOF_LEAF_STRIDED,
    STOF_LEAF_RANDOM,
    STOF_LEAF_DOCS,
    STOF_LEAF_PREFIX,
    STOF_LEAF_BITMAP,
    STOF_LEAF_HEAD_SLIDING,
    STOF_LEAF_HEAD_CAUSAL_SLIDING
};

enum stof_spec_op { STOF_SPEC_LEAF, STOF_SPEC_AND, STOF_SPEC_OR, STOF_SPEC_NOT };

typedef struct stof_spec_node {
    enum stof_spec_op op;
    /* leaf */
    enum stof_leaf_kind kind;
    const char *name;               /* the leaf's name in the grammar */
    int n_params;                   /* parameters given */
    uint64_t v[STOF_SPEC_MAX_PARAMS]; /* integers (clamped, not SEED) */
    double prob;                    /* random's P */
    uint64_t prob_mant;             /* P = prob_mant * 10^-prob_scale, as */
    int prob_scale;                 /* written (trailing zeros dropped) */
    int leaf_id;                    /* 0..n_leaves-1 in parse order */
    /* inner node (NOT has one kid) */
    struct stof_spec_node **kids;
    int n_kids, cap_kids;
} stof_spec_node;

/* Uses of instance data, for stof__spec_uses. */
enum {
    STOF_SPEC_USES_DOCS = 1,   /* a docs leaf */
    STOF_SPEC_USES_PREFIX = 2, /* a prefix leaf without P */
    STOF_SPEC_USES_SEED = 4,   /* random or bigbird */
    STOF_SPEC_USES_NOT = 8,    /* a negation */
    STOF_SPEC_USES_BITMAP = 16, /* a bitmap leaf */
    STOF_SPEC_USES_HEAD = 32    /* a head_* leaf: data per (sequence, head) */
};

typedef struct stof_spec {
    stof_spec_node *root;
    int n_leaves;
    int height;      /* inner levels (a lone leaf has 0) */
    unsigned uses;   /* STOF_SPEC_USES_* */
} stof_spec;

/* Parse `text`. Errors: STOF_ERR_INVALID_ARGUMENT naming the column and what
 * was expected, STOF_ERR_OUT_OF_MEMORY. */
stof_status stof__spec_parse(stof_context *ctx, const char *text,
                             stof_spec **out /* OUT */);
void stof__spec_free(stof_spec **s);
/* The canonical text of a spec (spaces removed, parameters as the library
 * reads them, parentheses only where needed): equal texts are equal
 * families. Returns the length it needs (without the NUL); writes at most
 * n bytes, NUL-terminated when n > 0. */
size_t stof__spec_canonical(const stof_spec *s, char *buf, size_t n);
/* The list of leaves for messages. */
extern const char stof__spec_leaf_names[];

/* The instance values of one sequence. */
typedef struct stof_spec_inst {
    int64_t q_offset;    /* key position of query row 0, >= 0 */
    int64_t prefix;      /* `prefix` without P: keys k < prefix */
    const int32_t *doc;  /* document id of key positions 0..seq_k-1,
                            non-decreasing; NULL = one document */
    uint64_t seed;       /* mixed into the SEED of random and bigbird */
    const uint32_t *bitmap; /* `bitmap`: row q's keys at bitmap +
                               q * bitmap_words (32 a word); NULL = all */
    int64_t bitmap_words;
    int64_t window;      /* head_sliding / head_causal_sliding W, >= 0;
                            0 with has_window 0: no limit */
    int has_window;
} stof_spec_inst;

/* An evaluator of one instance: seq_q x seq_k, with its per-leaf state
 * (not thread-safe; one per thread). */
typedef struct stof_spec_eval stof_spec_eval;

stof_status stof__spec_eval_new(stof_context *ctx, const stof_spec *s,
                                int64_t seq_q, int64_t seq_k,
                                const stof_spec_inst *inst /* NULL = none */,
                                stof_spec_eval **out /* OUT */);
void stof__spec_eval_free(stof_spec_eval **e);

/* Words w0 .. w0+nw-1 of row q (key k is bit k%64 of word k/64; bits at or
 * past seq_k are 0). 0 <= q < seq_q, 0 <= w0, w0 + nw <= ceil(seq_k/64). */
void stof__spec_eval_words(stof_spec_eval *e, int64_t q, int64_t w0, int nw,
                           uint64_t *out /* OUT */);

/* The class of the rectangle rows q0..q1 x keys k0..k1 (inclusive, inside
 * the matrix) from the spec's structure alone: STOF_TILE_EMPTY when no
 * element is allowed, STOF_TILE_FULL when every one is, else -1 (unknown:
 * look at the elements). Never wrong, sometimes unknown. */
int stof__spec_eval_classify(stof_spec_eval *e, int64_t q0, int64_t q1,
                             int64_t k0, int64_t k1);

/* The spec as the program of the GPU format builder (mask_build.cu): its
 * nodes in postfix order, four int32 each: {STOF_PROG_LEAF, kind, a, b}
 * (a, b: sliding/causal_sliding/strided W or S in a; dilated W, D and
 * longformer W, G in a, b; prefix P in b, or -1 for the sequence's
 * prefix; bigbird B, W in a, b, then two {STOF_PROG_PARAM, ...} nodes:
 * {G, R, 0} and {SEED low, SEED high, 0}), or {STOF_PROG_AND / _OR, number
 * of operands, 0, 0}, or {STOF_PROG_NOT, 0, 0, 0}. Returns the number of
 * nodes, or -1 when the spec has a leaf the GPU does not evaluate (random:
 * drawn by a sequential generator; bigbird with more than
 * STOF_PROG_MAX_RANDOM random blocks) or more than cap nodes. *max_stack:
 * the deepest evaluation stack. */
enum { STOF_PROG_LEAF = 0, STOF_PROG_AND = 1, STOF_PROG_OR = 2,
       STOF_PROG_NOT = 3, STOF_PROG_PARAM = 4 };
#define STOF_PROG_MAX_RANDOM 64
int stof__spec_program(const stof_spec *s, int32_t *prog, int cap,
                       int *max_stack /* OUT, may be NULL */);

/* stof_format_build_family with the parts of stof__format_build_parts. */
stof_status stof__format_build_family_parts(stof_context *ctx,
                                            const stof_mask_family *fam,
                                            int seq_q, int seq_k,
                                            const stof_mask_data *data, int b,
                                            int block_m, int block_n,
                                            int parts,
                                            stof_format **fmt /* OUT */);

/* The parsed spec of a family (family.c). */
const stof_spec *stof__family_spec(const stof_mask_family *fam);
/* The family fam over the packed layout (stof.h, STOF_LAYOUT_PACKED):
 * the same spec, its instances n_seq sequences packed one after another
 * in one format (what the GPU builder and the plans read from
 * stof__family_n_seq). Freed with stof_mask_family_free. */
stof_status stof__family_packed(stof_context *ctx, const stof_mask_family *fam,
                                int n_seq, stof_mask_family **out);
/* The sequences of a packed family, 0 for any other. */
int stof__family_n_seq(const stof_mask_family *fam);
/* The family fam for the grouped-query row view of one-row queries
 * (attention_family.c): every row of an instance is the sequence's query
 * row 0 (its position q_offset; all rows exist when q_len >= 1), so the
 * rows can stand for the query heads of a K/V head. Padded layout only.
 * Freed with stof_mask_family_free. */
stof_status stof__family_row_one(stof_context *ctx,
                                 const stof_mask_family *fam,
                                 stof_mask_family **out);
/* 1 for a family of stof__family_row_one, else 0. */
int stof__family_rows_one(const stof_mask_family *fam);

#endif /* STOF_MASK_SPEC_H */
