/*
 * search.h - the two-stage search. Stage 1 keeps the cost model's best few
 * candidates of each kernel kind; stage 2 compiles them in parallel (NVRTC
 * on libuv's thread pool), then, on the calling thread, loads each, checks
 * it against the reference on random inputs (a mismatch is rejected and
 * logged, never chosen) and times it, within a time budget, and picks the
 * fastest verified candidate.
 *
 * What "compile", "load", "verify" and "time" mean is given by a backend,
 * so the selection logic is tested on the CPU with a fake one.
 */
#ifndef STOF_SEARCH_H
#define STOF_SEARCH_H

#include "cost_model.h"

typedef struct stof_search_backend {
    void *user;
    /* Compile candidate c into an artifact (e.g. a cubin, malloc'd).
     * Called on pool threads, concurrently: must not touch the context.
     * On failure return nonzero and write a message into err[errn]. */
    int (*compile)(void *user, const stof_candidate *c, void **art,
                   size_t *art_size, char *err, size_t errn);
    /* Load an artifact on the calling thread; *handle is passed to the
     * calls below. Nonzero on failure (message in err). */
    int (*load)(void *user, const stof_candidate *c, const void *art,
                size_t art_size, void **handle, char *err, size_t errn);
    /* Run the candidate on the verification inputs; *rel_err is
     * ||out - ref|| / ||ref|| (+inf for NaN or unwritten outputs). */
    int (*verify)(void *user, void *handle, double *rel_err, char *err,
                  size_t errn);
    /* The candidate's median time in ms. */
    int (*time)(void *user, void *handle, double *ms, char *err, size_t errn);
    void (*unload)(void *user, void *handle);
} stof_search_backend;

typedef struct stof_search_opts {
    int top_k;          /* stage 1: candidates kept per kernel kind */
    int threads;        /* compile threads (0 = number of cores) */
    double budget_s;    /* stage 2 wall-clock budget (0 = none); at least
                           one candidate is always timed */
    double tolerance;   /* verification: largest accepted relative error */
    /* Optional: artifacts compiled beforehand (the batch warm-up compiles
     * every problem's candidates in one pool): pre_art[i] non-NULL means
     * candidate i needs no compile (the search copies it). */
    void *const *pre_art;
    const size_t *pre_size;
} stof_search_opts;

typedef struct stof_search_result {
    stof_candidate winner;
    double winner_ms;     /* measured */
    double runner_up_ms;  /* second best verified (0 if none) */
    double model_ms;      /* measured time of the model's first choice
                             (0 if it was not timed or failed) */
    int n_selected;       /* after stage 1 */
    int n_timed, n_rejected, n_failed;
    void *winner_art;     /* the winner's artifact, owned by the caller */
    size_t winner_art_size;
} stof_search_result;

/* Stage 1: from `ranked` (sorted by predicted time), keep the first top_k
 * of each kind, in rank order. Returns the number written to out (at most
 * max). */
int stof__search_select(const stof_candidate *ranked, int n, int top_k,
                        stof_candidate *out, int max);

/* Stage 2 over `sel` (n candidates, the model's first choice first). On
 * success res->winner is the fastest verified candidate. Errors:
 * STOF_ERR_VERIFY when no candidate passed verification (the log says
 * why each failed), STOF_ERR_OUT_OF_MEMORY. Progress goes to ctx's log
 * at STOF_LOG_INFO. */
stof_status stof__search_run(stof_context *ctx, const stof_candidate *sel,
                             int n, const stof_search_opts *o,
                             const stof_search_backend *b,
                             stof_search_result *res /* OUT */);

/* Run fn(user, i) for i in 0..n-1 on libuv's thread pool (threads: 0 =
 * number of cores; the pool's size is fixed at its first use in the
 * process), returning when all are done. Falls back to this thread when no
 * pool can be had. */
void stof__pool_run(int threads, int n, void (*fn)(void *user, int i),
                    void *user);

/* A one-line description of a candidate, e.g. "block 128x64 w4 s2". */
void stof__candidate_str(const stof_candidate *c, char *buf, size_t n);

#endif
