/*
 * testutil.h - helpers shared by the Criterion suites: a seeded generator,
 * fp16/bf16 conversion, relative error, and the GPU skip.
 */
#ifndef STOF_TESTUTIL_H
#define STOF_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "stof.h"

/* splitmix64: small, seedable, good enough for test data. */
typedef struct tu_rng {
    uint64_t s;
} tu_rng;
uint64_t tu_next(tu_rng *r);
/* Uniform in [0, 1). */
double tu_uniform(tu_rng *r);
/* Uniform integer in [0, n). */
uint64_t tu_below(tu_rng *r, uint64_t n);
/* A seed that differs between runs unless STOF_TEST_SEED is set; printed
 * once so a failure can be replayed. */
uint64_t tu_seed(void);

uint16_t tu_f32_to_f16(float f);
float tu_f16_to_f32(uint16_t h);
uint16_t tu_f32_to_bf16(float f);
float tu_bf16_to_f32(uint16_t h);

/* ||a - b|| / ||b|| over n doubles; NaN or Inf anywhere gives +Inf. When
 * ||b|| is 0 the result is ||a - b||. */
double tu_rel_err(const double *a, const double *b, size_t n);

/* A random dense mask with each element kept with probability p
 * (caller frees). */
uint8_t *tu_random_dense(tu_rng *r, int seq_q, int seq_k, double p);

/* Synchronise the current CUDA context: NULL when the work so far
 * succeeded, else the driver's name of the error. */
const char *tu_sync_error(void);

/* The path of a file under the source tree (static buffer). */
const char *tu_src_path(const char *rel);
/* A database path of this process (/tmp/stof-test-NAME-PID.db, fixed by
 * the first call, so forked children share it; NAME up to 32 bytes), and
 * the removal of it with its -wal and -shm files. */
const char *tu_process_db(const char *name);
void tu_remove_db(const char *path);

/* A mask from a spec, or one of the generated masks named "#single" (one
 * key per row), "#lastcol" (only the last key), "#halfempty" (every other
 * row empty) and "#colsparse" (scattered keys, every 13th row empty).
 * Asserts on failure. */
stof_mask *tu_make_mask(stof_context *ctx, const char *spec, int seq_q,
                        int seq_k);
/* m with its rows grouped by residue class when m has a row period (see
 * stof__mask_row_period), else shuffled with rng; row r of the result is
 * row (*perm)[r] of m (*perm malloc'd). *period is the period (1: none). */
stof_mask *tu_permuted_mask(stof_context *ctx, const stof_mask *m,
                            tu_rng *rng, int32_t **perm, int *period);
/* Elements spanned by a tensor with strides st (b, h, s) and rows of d. */
size_t tu_tensor_elems(const int64_t st[3], int b, int h, int s, int d);
/* n random fp16/bf16 values in [-amp, amp]: raw bits and their floats. */
void tu_fill_random(tu_rng *r, uint16_t *raw, float *f, size_t n,
                    stof_dtype dt, float amp);
/* A descriptor; STOF_LAYOUT_STRIDED means BSHD with `pad` extra elements
 * per q/o row and 2*pad per k/v row. */
void tu_make_desc(stof_attention_desc *d, int batch, int heads, int seq_q,
                  int seq_k, int head_dim, stof_dtype dt, stof_layout layout,
                  int pad);

/* tu_rel_err of the 16-bit output ho against the fp32 reference fo (both
 * laid out with d's o_stride) over batch elements b0 .. b0 + nb - 1, every
 * head, row and column; INFINITY when an element is not finite. */
double tu_out_rel_err(const stof_attention_desc *d, const uint16_t *ho,
                      const float *fo, int b0, int nb);

/* Each row's log-sum-exp of problem d (its strides, kv_heads, soft-cap
 * and ALiBi slopes) over mask m's keys, in double, from fp32 q and k:
 * want[(b * heads + h) * seq_q + i], -inf for a row without keys. */
void tu_lse_ref(const stof_attention_desc *d, const stof_mask *m,
                const float *fq, const float *fk, double *want);

/* tu_lse_ref with the additive bias of a descriptor with bias = 1 (fp32,
 * d->bias_stride; -inf masks), or NULL. */
void tu_lse_ref_bias(const stof_attention_desc *d, const stof_mask *m,
                     const float *fq, const float *fk, const float *bias,
                     double *want);

/* Open a context with settings s (NULL: the defaults) or skip the test,
 * saying why no GPU is usable. */
stof_context *tu_open_gpu_or_skip(const stof_settings *s);

/* main() for a GPU suite: when no GPU is usable, print why and return 77
 * (meson counts it as skipped); otherwise run the Criterion tests. The
 * probe runs in a child process, and only in Criterion's runner process, so
 * CUDA is never initialised in a process that Criterion forks from. Call it
 * from a main() with default visibility: Criterion re-enters main by
 * symbol. */
int tu_gpu_suite_main(const char *suite, int argc, char **argv);

/* A tuning record that passes every check (stof__record_check): an
 * attention record of a block kernel for head_dim 64 on an H100 of this
 * stof build, fields derived from `seed` (the key is seed in 32 hex
 * digits), a cubin of cubin_size bytes (malloc'd: stof__db_record_clear
 * frees it) and its content hash. Change fields, then call
 * stof__db_record_hash again to keep it valid. */
struct stof_db_record;
void tu_record_fill(struct stof_db_record *r, uint64_t seed,
                    size_t cubin_size);

#endif
