/*
 * gpu_backend.h - the search backend on the context's GPU (gpu_backend.c).
 */
#ifndef STOF_GPU_BACKEND_H
#define STOF_GPU_BACKEND_H

#include "search.h"

typedef struct stof_gpu_backend stof_gpu_backend;

/* Allocate the verification inputs for (d, m) (random, from `seed`), an L2
 * flush buffer and timing events, and compute the reference output with the
 * reference kernel. reps: timed runs per candidate (0 = 15). The backend
 * borrows ctx and m until freed. */
stof_status stof__gpu_backend_new(stof_context *ctx,
                                  const stof_attention_desc *d,
                                  const stof_mask *m, uint64_t seed, int reps,
                                  stof_gpu_backend **out /* OUT */);
void stof__gpu_backend_free(stof_gpu_backend **b);
stof_search_backend stof__gpu_backend_ops(stof_gpu_backend *b);

/* Compile a candidate's kernel with NVRTC (no GPU work; thread-safe for
 * distinct contexts): *cubin is malloc'd. (attention.c) */
stof_status stof__kernel_compile(stof_context *ctx, const stof_candidate *c,
                                 int head_dim, stof_dtype dt,
                                 void **cubin /* OUT */, size_t *size /* OUT */);

/* A plan for candidate c whose kernel is the given cubin (from the search
 * or the tuning database): formats are built and uploaded, the cubin is
 * loaded, nothing is compiled. (attention.c) */
stof_status stof__plan_from_cubin(stof_context *ctx,
                                  const stof_attention_desc *d,
                                  const stof_mask *m, const stof_candidate *c,
                                  const void *cubin, size_t size,
                                  stof_plan **out /* OUT */);

#endif
