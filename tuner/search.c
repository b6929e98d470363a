/*
 * search.c - stage 1 selection and the stage 2 engine (search.h).
 */
#include "search.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

void stof__candidate_str(const stof_candidate *c, char *buf, size_t n)
{
    static const char *const kinds[] = {"reference", "block", "rowwise",
                                        "wgmma", "wgmma-gather"};
    const char *k = c->kind >= 0 && c->kind < 5 ? kinds[c->kind] : "?";
    if (c->kind == STOF_KERNEL_REFERENCE)
        snprintf(buf, n, "%s", k);
    else if (c->group > 1)
        snprintf(buf, n, "%s %dx%d w%d s%d rows%%%d", k, c->cfg.block_m,
                 c->cfg.block_n, c->cfg.warps, c->cfg.stages, c->group);
    else
        snprintf(buf, n, "%s %dx%d w%d s%d", k, c->cfg.block_m, c->cfg.block_n,
                 c->cfg.warps, c->cfg.stages);
}

int stof__search_select(const stof_candidate *ranked, int n, int top_k,
                        stof_candidate *out, int max)
{
    int per_kind[8] = {0}, m = 0;
    for (int i = 0; i < n && m < max; i++) {
        int k = ranked[i].kind;
        if (k < 0 || k >= 8 || per_kind[k] >= top_k)
            continue;
        per_kind[k]++;
        out[m++] = ranked[i];
    }
    return m;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* libuv's pool size is read once per process from UV_THREADPOOL_SIZE, at
 * its first use: set it (when the caller did not) before that. */
static void size_pool(int threads)
{
    if (getenv("UV_THREADPOOL_SIZE"))
        return;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 4;
    }
    if (threads > 128)
        threads = 128;
    char v[16];
    snprintf(v, sizeof(v), "%d", threads);
    setenv("UV_THREADPOOL_SIZE", v, 0);
}

typedef struct pool_item {
    uv_work_t req;
    void (*fn)(void *user, int i);
    void *user;
    int i;
} pool_item;

static void pool_work(uv_work_t *req)
{
    pool_item *it = req->data;
    it->fn(it->user, it->i);
}

static void pool_after(uv_work_t *req, int status)
{
    (void)req;
    (void)status; /* a cancelled item leaves its result unset: the caller
                     sees that as a failure */
}

void stof__pool_run(int threads, int n, void (*fn)(void *user, int i),
                    void *user)
{
    pool_item *items = calloc((size_t)(n > 0 ? n : 1), sizeof(*items));
    uv_loop_t loop;
    const int loop_ok = items && uv_loop_init(&loop) == 0;
    int queue_ok = loop_ok;
    if (loop_ok)
        size_pool(threads);
    for (int i = 0; i < n; i++) {
        if (queue_ok) {
            items[i] = (pool_item){.fn = fn, .user = user, .i = i};
            items[i].req.data = &items[i];
            if (uv_queue_work(&loop, &items[i].req, pool_work, pool_after) == 0)
                continue;
            queue_ok = 0;
        }
        fn(user, i); /* no pool: here */
    }
    if (loop_ok) {
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
    }
    free(items);
}

/* One compile job. */
typedef struct job {
    const stof_search_backend *b;
    const stof_candidate *c;
    void *art;
    size_t art_size;
    int rc;
    char err[1024];
} job;

static void job_run(void *user, int i)
{
    job *j = (job *)user + i;
    j->rc = j->b->compile(j->b->user, j->c, &j->art, &j->art_size, j->err,
                          sizeof(j->err));
}

stof_status stof__search_run(stof_context *ctx, const stof_candidate *sel,
                             int n, const stof_search_opts *o,
                             const stof_search_backend *b,
                             stof_search_result *res)
{
    memset(res, 0, sizeof(*res));
    res->n_selected = n;
    if (n <= 0)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "search: no candidates");
    job *jobs = calloc((size_t)n, sizeof(*jobs));
    if (!jobs)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory starting the search");
    const double t0 = now_s();

    /* Compile every candidate in parallel (or take the precompiled). */
    int to_compile = 0;
    for (int i = 0; i < n; i++) {
        jobs[i].b = b;
        jobs[i].c = &sel[i];
        if (o->pre_art && o->pre_art[i]) {
            jobs[i].art = malloc(o->pre_size[i]);
            if (!jobs[i].art) {
                jobs[i].rc = -1;
                snprintf(jobs[i].err, sizeof(jobs[i].err), "out of memory");
            } else {
                memcpy(jobs[i].art, o->pre_art[i], o->pre_size[i]);
                jobs[i].art_size = o->pre_size[i];
            }
        } else {
            jobs[i].rc = -2; /* to compile */
            to_compile++;
        }
    }
    if (to_compile) {
        /* Only the jobs marked -2 are compiled. */
        job *pending = calloc((size_t)to_compile, sizeof(*pending));
        if (!pending) {
            free(jobs);
            return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                              "out of memory starting the search");
        }
        for (int i = 0, k = 0; i < n; i++)
            if (jobs[i].rc == -2)
                pending[k++] = jobs[i];
        stof__pool_run(o->threads, to_compile, job_run, pending);
        for (int i = 0, k = 0; i < n; i++)
            if (jobs[i].rc == -2)
                jobs[i] = pending[k++];
        free(pending);
    }
    stof__log(ctx, STOF_LOG_INFO,
              "search: compiled %d candidates (%d precompiled) in %.2f s",
              to_compile, n - to_compile, now_s() - t0);

    /* Load, verify and time them in rank order, on this thread. */
    int best = -1, second = -1;
    double best_ms = INFINITY, second_ms = INFINITY;
    for (int i = 0; i < n; i++) {
        char name[64], err[1024] = "";
        stof__candidate_str(&sel[i], name, sizeof(name));
        if (o->budget_s > 0 && res->n_timed > 0 &&
            now_s() - t0 > o->budget_s) {
            stof__log(ctx, STOF_LOG_INFO,
                      "search: budget of %.1f s reached after %d of %d "
                      "candidates",
                      o->budget_s, i, n);
            break;
        }
        if (jobs[i].rc != 0) {
            res->n_failed++;
            stof__log(ctx, STOF_LOG_WARN, "search: %s did not compile: %s",
                      name, jobs[i].err);
            continue;
        }
        void *h = NULL;
        if (b->load(b->user, &sel[i], jobs[i].art, jobs[i].art_size, &h, err,
                    sizeof(err)) != 0) {
            res->n_failed++;
            stof__log(ctx, STOF_LOG_WARN, "search: %s did not load: %s", name,
                      err);
            continue;
        }
        double rel = INFINITY, ms = INFINITY;
        int rc = b->verify(b->user, h, &rel, err, sizeof(err));
        if (rc != 0 || !(rel <= o->tolerance)) {
            res->n_rejected++;
            stof__log(ctx, STOF_LOG_WARN,
                      "search: %s rejected: %s (relative error %.3g, "
                      "tolerance %.3g)",
                      name, rc ? err : "wrong result", rel, o->tolerance);
            b->unload(b->user, h);
            continue;
        }
        rc = b->time(b->user, h, &ms, err, sizeof(err));
        b->unload(b->user, h);
        if (rc != 0 || !isfinite(ms)) {
            res->n_failed++;
            stof__log(ctx, STOF_LOG_WARN, "search: %s could not be timed: %s",
                      name, err);
            continue;
        }
        res->n_timed++;
        if (i == 0)
            res->model_ms = ms;
        stof__log(ctx, STOF_LOG_INFO,
                  "search: %-22s %8.4f ms (model %.4f ms, error %.2e)", name,
                  ms, sel[i].predicted_ms, rel);
        if (ms < best_ms) {
            second = best;
            second_ms = best_ms;
            best = i;
            best_ms = ms;
        } else if (ms < second_ms) {
            second = i;
            second_ms = ms;
        }
    }
    stof_status st = STOF_OK;
    if (best < 0) {
        st = stof__fail(ctx, STOF_ERR_VERIFY,
                        "search: none of %d candidates compiled, passed "
                        "verification and was timed (%d failed, %d rejected)",
                        n, res->n_failed, res->n_rejected);
    } else {
        res->winner = sel[best];
        res->winner_ms = best_ms;
        res->runner_up_ms = second >= 0 ? second_ms : 0.0;
        res->winner_art = jobs[best].art;
        res->winner_art_size = jobs[best].art_size;
        jobs[best].art = NULL;
        char name[64];
        stof__candidate_str(&res->winner, name, sizeof(name));
        stof__log(ctx, STOF_LOG_INFO,
                  "search: winner %s, %.4f ms (%d timed, %d rejected, %d "
                  "failed, %.2f s)",
                  name, best_ms, res->n_timed, res->n_rejected, res->n_failed,
                  now_s() - t0);
    }
    for (int i = 0; i < n; i++)
        free(jobs[i].art);
    free(jobs);
    return st;
}
