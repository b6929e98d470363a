/*
 * search.h - the one two-stage search of stof, for every fused kernel.
 *
 * An operation (an attention problem, one GEMM of a layer, one norm
 * kernel, any later template) implements stof_search_op: its candidates
 * ranked by its cost model (stage 1's input), how to compile one (on pool
 * threads), load it, verify it against its reference, time it, describe
 * it, and optionally store the winner. The engine does the rest, once for
 * all of them:
 *   stage 1: keep the best few candidates of each kernel family;
 *   stage 2: compile the kept candidates of every operation of the call in
 *            one parallel pool (NVRTC on libuv's threads; identical kernels
 *            of several operations compiled once), then, operation by
 *            operation on the calling thread, load, verify (a mismatch is
 *            rejected and logged, never chosen) and time each in rank
 *            order within the budget, and pick the fastest verified one;
 *            when others are within a few percent of it, those finalists
 *            are timed again in alternating rounds and ranked by the
 *            median (a near tie is decided the same way every time).
 * Budget, repetitions (the op's timing), progress and logging behave the
 * same for every operation. The selection logic is tested on the CPU with
 * a fake operation (tests/test_search.c).
 */
#ifndef STOF_SEARCH_H
#define STOF_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* An operation's candidates and what to do with them. Candidate i is
 * referred to by its index, 0..n-1, in rank order (the cost model's
 * fastest first); the operation keeps their parameters. */
typedef struct stof_search_op {
    void *user;
    const char *name;   /* for logs, e.g. "attention 4x16x4096x64 fp16" */
    int n;              /* candidates */
    int top_k;          /* candidates kept per kind (0: the call's top_k;
                           an operation that lists only what it wants
                           timed sets n) */
    /* The kernel family of candidate i (stage 1 keeps top_k of each). */
    int (*kind)(void *user, int i);
    /* Optional: candidates of one kind with equal keys are variants of one
     * shape (a tile's pipeline depths, which the cost model cannot tell
     * apart): stage 1 takes each shape's best first and the rest of top_k
     * in rank order after (stof__search_pick). NULL: rank order only. */
    uint64_t (*shape)(void *user, int i);
    /* The cost model's time of candidate i, in ms (0: the model has none). */
    double (*model_ms)(void *user, int i);
    /* A one-line description, e.g. "block 128x64 w4 s2". */
    void (*describe)(void *user, int i, char *buf, size_t n);
    /* Compile candidate i into an artifact (malloc'd). Runs on pool threads,
     * concurrently with other compiles: must not touch the context. A
     * candidate that needs no compiling (a library's algorithm) returns 0
     * with *art NULL. Nonzero on failure, with a message in err. */
    int (*compile)(void *user, int i, void **art, size_t *size, char *err,
                   size_t errn);
    /* Optional: equal keys mean equal artifacts (the same template and
     * parameters): such candidates, of any operation of the call, are
     * compiled once. 0: never shared. */
    uint64_t (*art_key)(void *user, int i);
    /* Load candidate i with its artifact on the calling thread; *handle
     * goes to the calls below. Nonzero on failure (message in err). */
    int (*load)(void *user, int i, const void *art, size_t size,
                void **handle, char *err, size_t errn);
    /* Run it on the operation's verification inputs: *rel_err is
     * ||out - ref|| / ||ref|| (+inf for NaN or unwritten outputs). */
    int (*verify)(void *user, void *handle, double *rel_err, char *err,
                  size_t errn);
    /* Its time in ms (the median of the operation's repetitions). */
    int (*time)(void *user, void *handle, double *ms, char *err,
                size_t errn);
    void (*unload)(void *user, void *handle);
    double tolerance;   /* largest accepted relative error */
    int exclusive;      /* 1: one candidate loaded at a time (the handles
                           share the operation's state, as a layer's GEMM
                           slot does); the finals then load each for each
                           timing */
} stof_search_op;

typedef struct stof_search_opts {
    int top_k;          /* stage 1: candidates kept per kernel family */
    int threads;        /* compile threads (0 = number of cores) */
    double budget_s;    /* wall-clock budget of the whole call, compiles
                           included (0 = none); every operation times at
                           least one candidate */
    int model_only;     /* no stage 2: compile each operation's first
                           candidate only, verify and time nothing (the
                           cost model's choice, for cache-only plans) */
} stof_search_opts;

typedef struct stof_search_result {
    int winner;           /* the chosen candidate, or -1 */
    double winner_ms;     /* measured (0 with model_only) */
    double runner_up_ms;  /* second best verified (0 if none) */
    double model_ms;      /* measured time of the op's first candidate
                             (0 if it was not timed or failed) */
    int n_selected;       /* after stage 1 */
    int n_timed, n_rejected, n_failed;
    int n_finals;         /* candidates re-timed in the finals (0: the
                             runner-up was not within a few percent) */
    void *winner_art;     /* the winner's artifact (NULL when it needs
                             none), owned by the caller: free() */
    size_t winner_art_size;
} stof_search_result;

/* k of the n candidates 0..n-1 (in rank order), written to out in rank
 * order: the first of each distinct key(user, i) in rank order, then, while
 * fewer than k, the others in rank order (key NULL: the first k). Returns
 * how many were written (at most k and n). */
int stof__search_pick(int n, int k, uint64_t (*key)(void *user, int i),
                      void *user, int *out);

/* Stage 1 for op: the candidates to time, as indices in rank order: top_k
 * of each kind (the first of each shape first, when op->shape is set:
 * stof__search_pick). Returns how many were written (at most max). */
int stof__search_select(const stof_search_op *op, int top_k, int *out,
                        int max);

/* Stage 1 and 2 for n_ops operations at once; res[i] is operation i's.
 * Returns STOF_OK when every operation has a winner; otherwise the first
 * failure (STOF_ERR_VERIFY when no candidate of an operation compiled,
 * passed verification and was timed: the log says why each failed;
 * STOF_ERR_OUT_OF_MEMORY), with the other operations' results still
 * filled. Progress goes to ctx's log at STOF_LOG_INFO. */
stof_status stof__search_run(stof_context *ctx, const stof_search_op *ops,
                             int n_ops, const stof_search_opts *o,
                             stof_search_result *res /* OUT: n_ops */);

/* Free the winners' artifacts of n results. */
void stof__search_results_free(stof_search_result *res, int n);

/* Run fn(user, i) for i in 0..n-1 on at most `threads` threads at a time
 * (0 = number of cores): workers started for this call and joined before
 * it returns; where no thread can be started, on this thread. */
void stof__pool_run(int threads, int n, void (*fn)(void *user, int i),
                    void *user);

#endif
