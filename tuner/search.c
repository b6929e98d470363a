/*
 * search.c - the two-stage search engine (search.h) and the compile pool.
 */
#include "search.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

int stof__search_pick(int n, int k, uint64_t (*key)(void *user, int i),
                      void *user, int *out)
{
    if (n <= 0 || k <= 0)
        return 0;
    if (k > n)
        k = n;
    char *taken = calloc((size_t)n, 1);
    uint64_t *keys = key ? malloc(sizeof(uint64_t) * (size_t)n) : NULL;
    if (!taken || !keys) { /* no keys (or no memory): the first k */
        free(taken);
        free(keys);
        for (int i = 0; i < k; i++)
            out[i] = i;
        return k;
    }
    for (int i = 0; i < n; i++)
        keys[i] = key(user, i);
    int m = 0;
    /* The first of each key, in rank order (n is a few hundred). */
    for (int i = 0; i < n && m < k; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = keys[j] == keys[i];
        if (!seen)
            taken[i] = 1, m++;
    }
    for (int i = 0; i < n && m < k; i++) /* rank order fills the rest */
        if (!taken[i])
            taken[i] = 1, m++;
    m = 0;
    for (int i = 0; i < n; i++)
        if (taken[i])
            out[m++] = i;
    free(taken);
    free(keys);
    return m;
}

/* The candidates of one kind, for stof__search_pick. */
typedef struct kind_view {
    const stof_search_op *op;
    const int *idx; /* the kind's candidates, in rank order */
} kind_view;

static uint64_t kind_view_shape(void *user, int i)
{
    const kind_view *v = user;
    return v->op->shape(v->op->user, v->idx[i]);
}

int stof__search_select(const stof_search_op *op, int top_k, int *out,
                        int max)
{
    enum { KINDS = 16 };
    int m = 0;
    /* idx: a kind's candidates; pick: stof__search_pick's answer; kinds:
     * each candidate's kind. */
    int *idx = op->shape ? malloc(sizeof(int) * 3 * (size_t)(op->n + 1))
                         : NULL;
    char *keep = idx ? calloc((size_t)op->n + 1, 1) : NULL;
    if (!keep) { /* no shapes (or no memory for them): rank order */
        free(idx);
        int per_kind[KINDS] = {0};
        for (int i = 0; i < op->n && m < max; i++) {
            int k = op->kind(op->user, i);
            if (k < 0 || k >= KINDS || per_kind[k] >= top_k)
                continue;
            per_kind[k]++;
            out[m++] = i;
        }
        return m;
    }
    int *pick = idx + op->n, *kinds = idx + 2 * op->n;
    for (int i = 0; i < op->n; i++)
        kinds[i] = op->kind(op->user, i);
    for (int k = 0; k < KINDS; k++) {
        int n = 0;
        for (int i = 0; i < op->n; i++)
            if (kinds[i] == k)
                idx[n++] = i;
        kind_view v = {op, idx};
        const int got = stof__search_pick(n, top_k, kind_view_shape, &v, pick);
        for (int j = 0; j < got; j++)
            keep[idx[pick[j]]] = 1;
    }
    for (int i = 0; i < op->n && m < max; i++)
        if (keep[i])
            out[m++] = i;
    free(idx);
    free(keep);
    return m;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The compiles of a search run on workers of its own, started for the
 * call and joined at its end (libuv's thread API): not on libuv's
 * process-wide pool, whose size is fixed by UV_THREADPOOL_SIZE at its
 * first use (the library would have to setenv it, racing every getenv of
 * the host's threads) and which a host may fill with its own work (a
 * planning call made from one of its threads would then wait forever for
 * compiles queued behind it). Workers take items in order from a shared
 * counter; the calling thread waits (it runs them only where no thread
 * can be started). */
static int want_threads(int threads)
{
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 4;
    }
    return threads > 128 ? 128 : threads;
}

typedef struct pool_run_state {
    void (*fn)(void *user, int i);
    void *user;
    int n;
    int next; /* the next item, taken atomically */
} pool_run_state;

static void pool_worker(void *arg)
{
    pool_run_state *r = arg;
    for (;;) {
        const int i = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
        if (i >= r->n)
            return;
        r->fn(r->user, i);
    }
}

void stof__pool_run(int threads, int n, void (*fn)(void *user, int i),
                    void *user)
{
    pool_run_state r = {.fn = fn, .user = user, .n = n > 0 ? n : 0};
    int t = want_threads(threads);
    if (t > r.n)
        t = r.n;
    uv_thread_t *th = t > 0 ? calloc((size_t)t, sizeof(*th)) : NULL;
    /* (NVRTC runs on these: the stack libuv's own pool threads get, not
     * whatever the caller's thread has) */
    const uv_thread_options_t opt = {.flags = UV_THREAD_HAS_STACK_SIZE,
                                     .stack_size = 8u << 20};
    int started = 0;
    for (int k = 0; th && k < t; k++) {
        if (uv_thread_create_ex(&th[k], &opt, pool_worker, &r) != 0)
            break; /* fewer workers: the ones there take the rest */
        started++;
    }
    if (!started)
        pool_worker(&r); /* no thread to be had: here */
    for (int k = 0; k < started; k++)
        uv_thread_join(&th[k]);
    free(th);
}

/* One compile: candidate `cand` of operation `op`. Jobs with the same
 * nonzero key share the artifact of the first of them (`same_as`). */
typedef struct job {
    const stof_search_op *op;
    int cand;
    uint64_t key;
    int same_as;          /* index of the job that compiles it, or -1 */
    void *art;
    size_t art_size;
    int rc;
    char err[1024];
} job;

static void job_run(void *user, int i)
{
    job *j = ((job **)user)[i];
    j->rc = j->op->compile(j->op->user, j->cand, &j->art, &j->art_size, j->err,
                           sizeof(j->err));
}

/* Stage 1 for every operation: the jobs, ops' kept candidates in rank
 * order, one after the other. *first[i] is operation i's first job. */
static job *select_all(const stof_search_op *ops, int n_ops,
                       const stof_search_opts *o, int *first, int *n_jobs)
{
    int total = 0;
    for (int i = 0; i < n_ops; i++)
        total += ops[i].n;
    job *jobs = calloc((size_t)(total > 0 ? total : 1), sizeof(*jobs));
    int *idx = malloc(sizeof(int) * (size_t)(total > 0 ? total : 1));
    if (!jobs || !idx) {
        free(jobs);
        free(idx);
        return NULL;
    }
    int nj = 0;
    for (int i = 0; i < n_ops; i++) {
        first[i] = nj;
        const int top_k = ops[i].top_k > 0 ? ops[i].top_k : o->top_k;
        int k = o->model_only ? (ops[i].n > 0)
                              : stof__search_select(&ops[i], top_k, idx,
                                                    total);
        for (int c = 0; c < k; c++) {
            job *j = &jobs[nj++];
            j->op = &ops[i];
            j->cand = o->model_only ? 0 : idx[c];
            j->key = ops[i].art_key ? ops[i].art_key(ops[i].user, j->cand) : 0;
            j->same_as = -1;
            for (int p = 0; j->key && p < nj - 1; p++)
                if (jobs[p].key == j->key && jobs[p].same_as < 0) {
                    j->same_as = p;
                    break;
                }
        }
    }
    first[n_ops] = nj;
    free(idx);
    *n_jobs = nj;
    return jobs;
}

/* Compile every job that owns its artifact, in one pool. */
static int compile_all(job *jobs, int nj, int threads)
{
    job **todo = malloc(sizeof(job *) * (size_t)(nj > 0 ? nj : 1));
    if (!todo)
        return -1;
    int n = 0;
    for (int i = 0; i < nj; i++)
        if (jobs[i].same_as < 0)
            todo[n++] = &jobs[i];
    stof__pool_run(threads, n, job_run, todo);
    free(todo);
    return n;
}

/* The artifact of job j (its own, or the one it shares). */
static const job *art_of(const job *jobs, const job *j)
{
    return j->same_as >= 0 ? &jobs[j->same_as] : j;
}

/* The finals: candidates timed within FINAL_MARGIN of the fastest (at most
 * FINAL_MAX of them, the fastest first) are timed up to FINAL_ROUNDS more
 * times, in alternating order, and ranked by the median of all their
 * timings. One timing each ranks kernels 1-2% apart by chance (clocks, the
 * L2's state after the flush, the neighbour on the bus); the rounds make
 * the choice of a near tie repeatable. The rounds are fewer (at least one)
 * where they would take more than FINAL_BUDGET_S (long kernels). */
enum { FINAL_MAX = 4, FINAL_ROUNDS = 4 };
#define FINAL_MARGIN 0.04
#define FINAL_BUDGET_S 1.0

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Re-time the finalists fin[0..nf) (job indices; ms[] their times by job
 * index - a, replaced by the finals' medians, or INFINITY for a finalist
 * that failed to load or run) in `rounds` rounds. Loaded together for the
 * rounds, or (op->exclusive) loaded, timed and unloaded for each timing.
 * Returns how many finished. */
static int run_finals(stof_context *ctx, const stof_search_op *op,
                      const job *jobs, int a, const int *fin, int nf,
                      int rounds, double *ms)
{
    void *h[FINAL_MAX] = {0};
    double t[FINAL_MAX][FINAL_ROUNDS + 1];
    int ok[FINAL_MAX] = {0}, n_ok = 0;
    char err[1024];
    for (int f = 0; f < nf; f++) {
        const job *aj = art_of(jobs, &jobs[fin[f]]);
        ok[f] = op->exclusive ||
                op->load(op->user, jobs[fin[f]].cand, aj->art, aj->art_size,
                         &h[f], err, sizeof(err)) == 0;
        t[f][0] = ms[fin[f] - a];
    }
    for (int r = 1; r <= rounds; r++)
        for (int k = 0; k < nf; k++) {
            const int f = r % 2 ? k : nf - 1 - k;
            double v = INFINITY;
            if (ok[f] && op->exclusive) {
                const job *aj = art_of(jobs, &jobs[fin[f]]);
                ok[f] = op->load(op->user, jobs[fin[f]].cand, aj->art,
                                 aj->art_size, &h[f], err, sizeof(err)) == 0;
            }
            if (ok[f] && (op->time(op->user, h[f], &v, err, sizeof(err)) ||
                          !isfinite(v)))
                ok[f] = 0;
            if (h[f] && op->exclusive) {
                op->unload(op->user, h[f]);
                h[f] = NULL;
            }
            t[f][r] = v;
        }
    for (int f = 0; f < nf; f++) {
        if (h[f])
            op->unload(op->user, h[f]);
        if (!ok[f]) { /* out of the running: it did not repeat its time */
            ms[fin[f] - a] = INFINITY;
            continue;
        }
        qsort(t[f], (size_t)rounds + 1, sizeof(double), cmp_double);
        const double med = 0.5 * (t[f][rounds / 2] + t[f][(rounds + 1) / 2]);
        char name[128];
        op->describe(op->user, jobs[fin[f]].cand, name, sizeof(name));
        stof__log(ctx, STOF_LOG_INFO,
                  "search %s: final %-24s %8.4f ms (median of %d timings)",
                  op->name, name, med, rounds + 1);
        ms[fin[f] - a] = med;
        n_ok++;
    }
    return n_ok;
}

/* Job i timed ms: the fastest and the runner-up so far. */
static void rank(int i, double ms, int *best, double *best_ms, int *second,
                 double *second_ms)
{
    if (ms < *best_ms) {
        *second = *best;
        *second_ms = *best_ms;
        *best = i;
        *best_ms = ms;
    } else if (ms < *second_ms) {
        *second = i;
        *second_ms = ms;
    }
}

/* Stage 2 for one operation over its jobs [a, b). */
static void run_op(stof_context *ctx, const stof_search_op *op, job *jobs,
                   int a, int b, const stof_search_opts *o, double t0,
                   stof_search_result *res)
{
    double best_ms = INFINITY, second_ms = INFINITY;
    int best = -1, second = -1;
    res->winner = -1;
    res->n_selected = b - a;
    /* Each timed candidate's time and the wall time its timing took. */
    double *all_ms = malloc(sizeof(double) * 2 * (size_t)(b > a ? b - a : 1));
    double *wall = all_ms ? all_ms + (b - a) : NULL;
    for (int i = a; all_ms && i < b; i++)
        all_ms[i - a] = INFINITY, wall[i - a] = 0.0;
    for (int i = a; i < b; i++) {
        const job *j = &jobs[i];
        const job *aj = art_of(jobs, j);
        char name[128], err[1024] = "";
        op->describe(op->user, j->cand, name, sizeof(name));
        if (!o->model_only && o->budget_s > 0 && res->n_timed > 0 &&
            now_s() - t0 > o->budget_s) {
            stof__log(ctx, STOF_LOG_INFO,
                      "search %s: budget of %.1f s reached after %d of %d "
                      "candidates",
                      op->name, o->budget_s, i - a, b - a);
            break;
        }
        if (aj->rc != 0) {
            res->n_failed++;
            stof__log(ctx, STOF_LOG_WARN, "search %s: %s did not compile: %s",
                      op->name, name, aj->err);
            continue;
        }
        if (o->model_only) {
            best = i;
            break;
        }
        void *h = NULL;
        if (op->load(op->user, j->cand, aj->art, aj->art_size, &h, err,
                     sizeof(err)) != 0) {
            res->n_failed++;
            stof__log(ctx, STOF_LOG_WARN, "search %s: %s did not load: %s",
                      op->name, name, err);
            continue;
        }
        double rel = INFINITY, ms = INFINITY;
        int rc = op->verify(op->user, h, &rel, err, sizeof(err));
        if (rc != 0 || !(rel <= op->tolerance)) {
            res->n_rejected++;
            stof__log(ctx, STOF_LOG_WARN,
                      "search %s: %s rejected: %s (relative error %.3g, "
                      "tolerance %.3g)",
                      op->name, name, rc ? err : "wrong result", rel,
                      op->tolerance);
            op->unload(op->user, h);
            continue;
        }
        const double tw = now_s();
        rc = op->time(op->user, h, &ms, err, sizeof(err));
        if (wall)
            wall[i - a] = now_s() - tw;
        op->unload(op->user, h);
        if (rc != 0 || !isfinite(ms)) {
            res->n_failed++;
            stof__log(ctx, STOF_LOG_WARN,
                      "search %s: %s could not be timed: %s", op->name, name,
                      err);
            continue;
        }
        res->n_timed++;
        if (all_ms)
            all_ms[i - a] = ms;
        if (j->cand == 0)
            res->model_ms = ms;
        stof__log(ctx, STOF_LOG_INFO,
                  "search %s: %-24s %8.4f ms (model %.4f ms, error %.2e)",
                  op->name, name, ms, op->model_ms(op->user, j->cand), rel);
        rank(i, ms, &best, &best_ms, &second, &second_ms);
    }
    /* The finals, when the runner-up is close and time is left. */
    if (best >= 0 && all_ms && second >= 0 &&
        second_ms <= best_ms * (1.0 + FINAL_MARGIN) && !o->model_only &&
        !(o->budget_s > 0 && now_s() - t0 > o->budget_s)) {
        int fin[FINAL_MAX], nf = 0;
        fin[nf++] = best;
        for (int i = a; i < b; i++) /* the closest others, in rank order */
            if (i != best && all_ms[i - a] <= best_ms * (1.0 + FINAL_MARGIN)) {
                if (nf < FINAL_MAX) {
                    fin[nf++] = i;
                    continue;
                }
                int worst = 1; /* replace the slowest kept one */
                for (int f = 2; f < nf; f++)
                    if (all_ms[fin[f] - a] > all_ms[fin[worst] - a])
                        worst = f;
                if (all_ms[i - a] < all_ms[fin[worst] - a])
                    fin[worst] = i;
            }
        double round_s = 0.0;
        for (int f = 0; f < nf; f++)
            round_s += wall[fin[f] - a];
        /* Within FINAL_BUDGET_S, and within what is left of the call's
         * budget (no finals when not even one round fits). */
        double cap = FINAL_BUDGET_S;
        if (o->budget_s > 0 && o->budget_s - (now_s() - t0) < cap)
            cap = o->budget_s - (now_s() - t0);
        int rounds = FINAL_ROUNDS;
        while (rounds > 1 && rounds * round_s > cap)
            rounds--;
        const int ran = round_s <= cap;
        const int n_ok =
            ran ? run_finals(ctx, op, jobs, a, fin, nf, rounds, all_ms) : 0;
        if (ran && n_ok == 0) {
            /* Every finalist failed to run again (a kernel that faults now
             * and then, or a context a fault broke): none is kept, rather
             * than the first timings' best. */
            best = second = -1;
        } else if (n_ok > 0) {
            /* Only the finalists that finished compete: the others lost
             * to the first timings already, and a single timing must not
             * beat medians. The runner-up from the others' first timings
             * when one finalist is left. */
            best = second = -1;
            best_ms = second_ms = INFINITY;
            for (int f = 0; f < nf; f++)
                rank(fin[f], all_ms[fin[f] - a], &best, &best_ms, &second,
                     &second_ms);
            for (int i = a; i < b && second < 0; i++) {
                int is_fin = 0;
                for (int f = 0; f < nf; f++)
                    is_fin |= fin[f] == i;
                if (!is_fin && all_ms[i - a] < second_ms)
                    second_ms = all_ms[i - a];
            }
            if (second < 0 && isfinite(second_ms))
                second = best; /* a runner-up time without a finalist */
            for (int f = 0; f < nf; f++)
                if (jobs[fin[f]].cand == 0 && isfinite(all_ms[fin[f] - a]))
                    res->model_ms = all_ms[fin[f] - a];
            res->n_finals = n_ok;
        }
    }
    free(all_ms);
    if (best < 0)
        return;
    const job *w = &jobs[best];
    const job *aw = art_of(jobs, w);
    res->winner = w->cand;
    res->winner_ms = o->model_only ? 0.0 : best_ms;
    res->runner_up_ms = second >= 0 ? second_ms : 0.0;
    if (aw->art) {
        res->winner_art = malloc(aw->art_size);
        if (res->winner_art) {
            memcpy(res->winner_art, aw->art, aw->art_size);
            res->winner_art_size = aw->art_size;
        } else {
            res->winner = -1; /* out of memory: no usable winner */
        }
    }
    if (res->winner >= 0 && !o->model_only) {
        char name[128];
        op->describe(op->user, w->cand, name, sizeof(name));
        stof__log(ctx, STOF_LOG_INFO,
                  "search %s: winner %s, %.4f ms (%d timed, %d rejected, %d "
                  "failed; %.2f s since the compiles began)",
                  op->name, name, best_ms, res->n_timed, res->n_rejected,
                  res->n_failed, now_s() - t0);
    }
}

stof_status stof__search_run(stof_context *ctx, const stof_search_op *ops,
                             int n_ops, const stof_search_opts *o,
                             stof_search_result *res)
{
    memset(res, 0, sizeof(*res) * (size_t)(n_ops > 0 ? n_ops : 0));
    for (int i = 0; i < n_ops; i++)
        res[i].winner = -1;
    if (n_ops <= 0)
        return STOF_OK;
    int *first = malloc(sizeof(int) * (size_t)(n_ops + 1));
    int nj = 0;
    job *jobs = first ? select_all(ops, n_ops, o, first, &nj) : NULL;
    if (!jobs) {
        free(first);
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory starting the search");
    }
    const double t0 = now_s();
    const int compiled = compile_all(jobs, nj, o->threads);
    stof__log(ctx, STOF_LOG_INFO,
              "search: %d operation%s, %d candidates, %d compiled in %.2f s",
              n_ops, n_ops == 1 ? "" : "s", nj, compiled < 0 ? 0 : compiled,
              now_s() - t0);
    stof_status st = compiled < 0 ? stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                                               "out of memory compiling")
                                  : STOF_OK;
    for (int i = 0; compiled >= 0 && i < n_ops; i++) {
        run_op(ctx, &ops[i], jobs, first[i], first[i + 1], o, t0, &res[i]);
        if (res[i].winner >= 0)
            continue;
        /* Whether that is an error is the caller's to say (a layer goes on
         * without a slot that has no usable kernel): logged as a warning,
         * recorded as the call's status. */
        char msg[512];
        snprintf(msg, sizeof(msg),
                 "search %s: none of %d candidates compiled, passed "
                 "verification and was timed (%d failed, %d rejected)",
                 ops[i].name, res[i].n_selected, res[i].n_failed,
                 res[i].n_rejected);
        if (ops[i].n > 0)
            stof__log(ctx, STOF_LOG_WARN, "%s", msg);
        if (st == STOF_OK)
            st = stof__fail_quiet(ctx, STOF_ERR_VERIFY, "%s", msg);
    }
    for (int i = 0; i < nj; i++)
        free(jobs[i].art);
    free(jobs);
    free(first);
    return st;
}

void stof__search_results_free(stof_search_result *res, int n)
{
    for (int i = 0; i < n; i++) {
        free(res[i].winner_art);
        res[i].winner_art = NULL;
        res[i].winner_art_size = 0;
    }
}
