/*
 * format.h - the format builder inside the library: formats built from any
 * source of mask rows (a bit mask, or a family evaluated tile by tile
 * without a bit matrix, family.c).
 */
#ifndef STOF_MASK_FORMAT_H
#define STOF_MASK_FORMAT_H

#include "internal.h"

/* Rows of a seq_q x seq_k mask, one row block at a time. */
typedef struct stof_row_source {
    int seq_q, seq_k;
    int words_per_row; /* ceil(seq_k / 64), at least 1 */
    int block_n;       /* the tiling the source was asked for */
    /* Make rows r0 .. r0+rows-1 available: *bits points to rows x
     * words_per_row words (valid until the next call); *act lists, in
     * ascending order, the *n_act words of a row that may be nonzero (NULL:
     * all of them); every word not listed is 0 in every row. A failure is
     * recorded on the context by the source and returned. */
    stof_status (*block)(void *user, int r0, int rows, const uint64_t **bits,
                         const int32_t **act, int *n_act);
    void *user;
} stof_row_source;

/* stof__format_build_parts over a row source (seq_q, seq_k >= 1). */
stof_status stof__format_build_source(stof_context *ctx,
                                      const stof_row_source *src, int block_m,
                                      int block_n, int parts,
                                      stof_format **fmt /* OUT */);

#endif /* STOF_MASK_FORMAT_H */
