/*
 * blaslt.h - cuBLASLt as a GEMM candidate, loaded with dlopen at run time
 * (never linked): the same C = epilogue(A W^T) as gemm.h where cuBLASLt
 * can express the epilogue (bias, GELU-tanh or ReLU after the bias, or a
 * residual added through its C matrix with beta = 1 and no activation;
 * never GELU-erf, SiLU or a norm).
 */
#ifndef STOF_BLASLT_H
#define STOF_BLASLT_H

#include "gemm.h"

/* 1 when libcublasLt could be loaded (tried once; $STOF_LIBCUBLASLT
 * overrides the name); else 0 with the reason in why[n]. */
int stof__blaslt_available(char *why, size_t n);

/* The loaded library's version (cublasLtGetVersion), 0 when absent. */
size_t stof__blaslt_version(void);

/* The file the library was loaded from, "" when absent. */
const char *stof__blaslt_path(void);

/* 1 when cuBLASLt can compute epilogue e. */
int stof__blaslt_epi_ok(const stof_gemm_epi *e);

/* Size of an algorithm's opaque description (cublasLtMatmulAlgo_t). */
#define STOF_BLASLT_ALGO_BYTES 64

/* The most workspace an algorithm may ask for (bytes): the heuristic is
 * asked for algorithms within it. What a chosen one needs is
 * stof__blaslt_ws_need's (often 0); callers allocate that. */
#define STOF_BLASLT_WORKSPACE (32u << 20)

typedef struct stof_blaslt_gemm stof_blaslt_gemm;

/* Describe an M x N x K problem with epilogue e for (lda, ldw, ldc) and ask
 * the heuristic for up to max_algos algorithms (at least one, else
 * STOF_ERR_UNSUPPORTED). max_algos 0: no heuristic query (a database hit
 * gives its algorithm to stof__blaslt_set_algo, which checks it; until
 * then there is none to run). Errors name the failing cuBLASLt call. */
stof_status stof__blaslt_create(stof_context *ctx, stof_dtype dt, int M, int N,
                                int K, int64_t lda, int64_t ldw, int64_t ldc,
                                const stof_gemm_epi *e, int max_algos,
                                stof_blaslt_gemm **out /* OUT */);
int stof__blaslt_n_algos(const stof_blaslt_gemm *g);
/* The workspace algorithm i needs (bytes, as cuBLASLt reports it); 0 for
 * an index out of range. */
size_t stof__blaslt_ws_need(const stof_blaslt_gemm *g, int i);
/* The opaque bytes of algorithm i (STOF_BLASLT_ALGO_BYTES), to store. */
void stof__blaslt_algo_bytes(const stof_blaslt_gemm *g, int i, void *out);
/* Replace the list by one stored algorithm, after checking that cuBLASLt
 * accepts it for this problem (cublasLtMatmulAlgoCheck);
 * STOF_ERR_UNSUPPORTED when not. */
stof_status stof__blaslt_set_algo(stof_context *ctx, stof_blaslt_gemm *g,
                                  const void *bytes);
/* Enqueue with algorithm i, given ws_bytes of workspace at workspace (0
 * and 0 allowed); STOF_ERR_INVALID_ARGUMENT when ws_bytes is below the
 * algorithm's need. Capture-safe. */
stof_status stof__blaslt_run(const stof_blaslt_gemm *g, int algo,
                             const stof_gemm_args *a, CUdeviceptr workspace,
                             size_t ws_bytes, CUstream stream);
void stof__blaslt_free(stof_blaslt_gemm **g);

/* Start cuBLASLt in ctx (load the library, create a handle that ctx holds
 * until stof_close), so that a later plan does not pay for it. STOF_OK
 * when started now or before; STOF_ERR_UNSUPPORTED without cuBLASLt. */
stof_status stof__blaslt_warm(stof_context *ctx);

#endif /* STOF_BLASLT_H */
