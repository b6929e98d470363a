/*
 * tune_workload.h - the workload files of `stof-tune tune`: which masks,
 * shapes, dtypes and layouts to tune (their cross product). The format is
 * documented in examples/suite.workload:
 *
 *     # comment              blank lines and comments are ignored
 *     mask SPEC              a mask spec (the rest of the line)
 *     shape BxHxNxD          seq_q = seq_k = N
 *     shape BxHxSQxSKxD      (or the numbers separated by spaces)
 *     dtype fp16 [bf16]      default fp16
 *     layout bhsd [bshd]     default bhsd
 *     layer NAME hidden=H heads=N ffn=F [kv_heads=K] [act=A] [norm=L]
 *           [pre|post] [gated] [no_bias] [qk_norm] [head_dim=D] [eps=E]
 *           [rope=THETA|table]
 *           [rope_dim=D]
 *                            a Transformer layer (stof_layer_plan); rope:
 *                            rotary position embeddings with base THETA
 *                            (a finite number > 1, e.g. 10000; "table":
 *                            frequencies of the layer's own, keyed for
 *                            every table, as Llama 3.1's), over the
 *                            first D channels of each head (rope_dim: 0,
 *                            the default, is the whole head; else a
 *                            multiple of 4 up to head_dim; only with
 *                            rope)
 *     tokens BxS [BxS...]    the layers' batch x sequence sizes
 *
 * Every directive may repeat; at least one mask and one shape, or one
 * layer and one tokens size, are needed. The problems: masks x shapes x
 * dtypes x layouts attention problems, then layers x tokens x masks x
 * dtypes layer problems (a mask applies to every sequence of a layer).
 * A file with a NUL byte, or larger than 4 MiB, is not a workload file.
 */
#ifndef STOF_TUNE_WORKLOAD_H
#define STOF_TUNE_WORKLOAD_H

#include <stddef.h>

#include "stof.h"

#define TW_MAX 256
#define TW_MAX_LAYERS 32
#define TW_MAX_PROBLEMS 65536 /* problems of one workload */

/* A layer of the workload: its descriptor without the sizes and dtype
 * (batch, seq, dtype are the problem's). */
typedef struct tw_layer {
    char name[64];
    stof_layer_desc d;
    int line;
} tw_layer;

typedef struct tw_workload {
    char *masks[TW_MAX];
    int mask_line[TW_MAX];   /* where each mask was given (0: command line) */
    int n_masks;
    int shapes[TW_MAX][5];   /* batch, heads, seq_q, seq_k, head_dim */
    int n_shapes;
    stof_dtype dtypes[2];
    int n_dtypes;
    stof_layout layouts[2];
    int n_layouts;
    tw_layer layers[TW_MAX_LAYERS];
    int n_layers;
    int tokens[TW_MAX][2];   /* batch, seq */
    int n_tokens;
    char source[512];        /* file name, or "command line" */
} tw_workload;

typedef struct tw_problem {
    const char *mask;
    int batch, heads, seq_q, seq_k, head_dim;
    stof_dtype dtype;
    stof_layout layout;
    /* a layer problem: the layer (batch, seq_q = seq_k and dtype above;
     * heads and head_dim 0), else NULL */
    const tw_layer *layer;
} tw_problem;

void tw_init(tw_workload *w /* OUT */);
void tw_free(tw_workload *w);

/* Parse a workload file. 0 on success; else nonzero with a one-line
 * message "FILE:LINE: what" (or "FILE: why" when it cannot be read). */
int tw_parse_file(const char *path, tw_workload *w, char *msg, size_t n);

/* The same from command-line values: each mask, shape, layer ("NAME
 * key=value ...", as after a file's 'layer') and tokens value a line's
 * (dtype, layout may be NULL). */
int tw_from_args(const char *const *masks, int n_masks,
                 const char *const *shapes, int n_shapes,
                 const char *const *layers, int n_layers,
                 const char *const *tokens, int n_tokens, const char *dtype,
                 const char *layout, tw_workload *w, char *msg, size_t n);

/* Check every mask spec (cheaply, at a small size: a spec's validity does
 * not depend on the sizes): 0, or nonzero with a message naming the file
 * and line of the bad mask. */
int tw_check_specs(stof_context *ctx, const tw_workload *w, char *msg,
                   size_t n);

/* The number of problems, problem i of them, and a one-line name. A
 * layer problem's descriptor: *d (filled when p->layer is set). */
int tw_count(const tw_workload *w);
void tw_get(const tw_workload *w, int i, tw_problem *p /* OUT */);
void tw_describe(const tw_problem *p, char *buf, size_t n);
void tw_layer_desc(const tw_problem *p, stof_layer_desc *d /* OUT */);

#endif
