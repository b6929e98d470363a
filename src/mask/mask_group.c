/*
 * mask_group.c - query-row grouping for masks whose rows fall into classes
 * with disjoint key sets. For dilated:W:D every allowed (q, k) has
 * (q - k) % D == 0, so rows of one residue class mod D use only keys of
 * that class: gathering the rows of a class together lets the row-wise
 * kernel compact their keys by D, instead of computing the whole band.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define GROUP_MAX_PERIOD 16

/* The column pattern of residue class r mod d: words with the bits of
 * every k with k % d == r, for one row of `words` words. */
static void class_pattern(uint64_t *pat, int words, int seq_k, int d, int r)
{
    memset(pat, 0, sizeof(uint64_t) * (size_t)words);
    for (int k = r; k < seq_k; k += d)
        pat[k >> 6] |= 1ull << (k & 63);
}

int stof__mask_row_period(const stof_mask *m)
{
    if (!m || m->count == 0 || m->seq_q < 2 * GROUP_MAX_PERIOD)
        return 1;
    const int words = m->words_per_row;
    uint64_t *pat = malloc(sizeof(uint64_t) * (size_t)words * GROUP_MAX_PERIOD);
    if (!pat)
        return 1;
    int found = 1;
    /* The smallest period that works: any multiple of it works too, and
     * the smallest keeps the classes largest. */
    for (int d = 2; d <= GROUP_MAX_PERIOD && found == 1; d++) {
        for (int r = 0; r < d; r++)
            class_pattern(pat + (size_t)r * words, words, m->seq_k, d, r);
        int ok = 1;
        for (int q = 0; q < m->seq_q && ok; q++) {
            const uint64_t *row = m->bits + (size_t)q * words;
            const uint64_t *p = pat + (size_t)(q % d) * words;
            for (int w = 0; w < words; w++) {
                if (row[w] & ~p[w]) {
                    ok = 0;
                    break;
                }
            }
        }
        if (ok)
            found = d;
    }
    free(pat);
    return found;
}

stof_status stof__mask_group_rows(stof_context *ctx, const stof_mask *m,
                                  int period, stof_mask **out,
                                  int32_t **perm)
{
    *out = NULL;
    *perm = NULL;
    if (period < 1)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "row grouping period %d is not positive", period);
    stof_mask *g = NULL;
    stof_status st = stof__mask_alloc(ctx, m->seq_q, m->seq_k, &g);
    if (st != STOF_OK)
        return st;
    int32_t *p = malloc(sizeof(int32_t) * (size_t)m->seq_q);
    if (!p) {
        stof_mask_free(&g);
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory grouping %d mask rows", m->seq_q);
    }
    const size_t row_bytes = sizeof(uint64_t) * (size_t)m->words_per_row;
    int n = 0;
    for (int r = 0; r < period; r++) {
        for (int q = r; q < m->seq_q; q += period) {
            p[n] = q;
            memcpy(g->bits + (size_t)n * m->words_per_row,
                   m->bits + (size_t)q * m->words_per_row, row_bytes);
            n++;
        }
    }
    g->count = m->count;
    *out = g;
    *perm = p;
    return STOF_OK;
}
