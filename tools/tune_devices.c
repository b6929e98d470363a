/*
 * tune_devices.c - the problems of a tuning run spread over the GPUs of a
 * host (tune_devices.h).
 *
 * Why processes, not threads: a CUDA context per process is the isolation
 * the driver gives (a kernel fault kills one worker, not the run), and
 * each worker is exactly a program planning problems against the shared
 * database, which is what the database is built and tested for. The
 * parent never initialises CUDA (it would not survive fork): it only
 * hands out problem numbers through shared memory, shows progress, and
 * collects the rows.
 */
#include "tune_devices.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "tune_cli.h"
#include "tune_text.h"

/* ----------------------------------------------------------- devices */

/* The number of CUDA devices, read in a child process; -1 with the reason
 * (or 0 devices) when there is no usable driver. */
static int device_count(char *why, size_t n)
{
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, n, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, n, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        const stof_api *a = stof__api();
        char msg[300] = "";
        int count = -1;
        if (!a->has_cuda)
            snprintf(msg, sizeof(msg), "%.250s", a->cuda_why);
        else if (a->cuInit(0) != CUDA_SUCCESS ||
                 a->cuDeviceGetCount(&count) != CUDA_SUCCESS)
            snprintf(msg, sizeof(msg), "the CUDA driver found no device");
        dprintf(fds[1], "%d %s", count, msg);
        _exit(0);
    }
    close(fds[1]);
    char buf[400] = "";
    ssize_t got = read(fds[0], buf, sizeof(buf) - 1);
    close(fds[0]);
    waitpid(pid, NULL, 0);
    int count = -1, off = 0;
    if (got <= 0 || sscanf(buf, "%d %n", &count, &off) < 1) {
        snprintf(why, n, "the device probe failed");
        return -1;
    }
    if (count <= 0)
        snprintf(why, n, "%s", buf + off);
    return count;
}

/* The list of --devices (syntax only): the ordinals into ords, k of them
 * (0 for "all" or NULL), or -1 with a message. */
static int parse_list(const char *spec, int *ords, int max, char *msg,
                      size_t n)
{
    int k = 0;
    if (!spec || strcmp(spec, "all") == 0)
        return 0;
    const char *p = spec;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= 1 << 16 ||
            (*end && *end != ',')) {
            snprintf(msg, n,
                     "--devices: '%s' is not 'all' or a list of GPU "
                     "ordinals such as 0,1",
                     spec);
            return -1;
        }
        for (int i = 0; i < k; i++)
            if (ords[i] == (int)v) {
                snprintf(msg, n, "--devices: GPU %ld is listed twice", v);
                return -1;
            }
        if (k == max) {
            snprintf(msg, n, "--devices: more than %d GPUs", max);
            return -1;
        }
        ords[k++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!k) {
        snprintf(msg, n, "--devices: no GPU given");
        return -1;
    }
    return k;
}

int td_devices_syntax(const char *spec, char *msg, size_t n)
{
    int ords[TD_MAX_DEVICES];
    return parse_list(spec, ords, TD_MAX_DEVICES, msg, n) >= 0;
}

int td_devices(const char *spec, int *ords, int max, char *msg, size_t n,
               int *rc)
{
    *rc = EXIT_USAGE;
    int k = parse_list(spec, ords, max, msg, n);
    if (k < 0)
        return 0;
    if (!spec)
        ords[k++] = 0; /* GPU 0, checked below like any list */
    char why[300] = "";
    int count = device_count(why, sizeof(why));
    if (count <= 0) {
        snprintf(msg, n, "no GPU found: %s", why);
        *rc = EXIT_NO_GPU;
        return 0;
    }
    if (!k) {
        for (k = 0; k < count && k < max; k++)
            ords[k] = k;
        return k;
    }
    for (int i = 0; i < k; i++)
        if (ords[i] >= count) {
            snprintf(msg, n, "--devices: GPU %d does not exist (this host "
                     "has %d)", ords[i], count);
            *rc = EXIT_NO_GPU;
            return 0;
        }
    return k;
}

/* ---------------------------------------------------------- progress */

static void progress(int done, int n, int device, const char *what,
                     int n_dev)
{
    if (isatty(fileno(stderr))) {
        int w = 30, fill = n ? (done * w) / n : w;
        fprintf(stderr, "\r[");
        for (int k = 0; k < w; k++)
            fputc(k < fill ? '#' : '.', stderr);
        fprintf(stderr, "] %d/%d %-60.60s", done, n, tt_term(what));
        if (done == n)
            fputc('\n', stderr);
    } else if (n_dev > 1) {
        fprintf(stderr, PROG ": [%d/%d] GPU %d: %s\n", done, n, device,
                tt_term(what));
    } else {
        fprintf(stderr, PROG ": [%d/%d] %s\n", done, n, tt_term(what));
    }
    fflush(stderr);
    tt_release();
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* --------------------------------------------------------------- run */

/* One device, in this process. */
static int run_here(const stof_settings *s, int ord, int n, td_problem_fn fn,
                    void *user, tune_row *rows, int quiet)
{
    stof_settings c = *s;
    c.device = ord;
    stof_context *ctx = NULL;
    int rc = open_gpu_ctx(&c, &ctx);
    if (rc)
        return rc;
    char fault[200] = "";
    for (int i = 0; i < n; i++) {
        if (fault[0]) { /* (the GPU is unusable: nothing more is tried) */
            rows[i].device = ord;
            snprintf(rows[i].error, sizeof(rows[i].error),
                     "not tuned: GPU %d faulted earlier: %s", ord, fault);
            continue;
        }
        const double t0 = now_s();
        rows[i].device = ord;
        const int failed = fn(user, ctx, i, &rows[i]);
        rows[i].plan_s = now_s() - t0;
        if (failed && !gpu_alive(ctx, fault, sizeof(fault)) && !fault[0])
            snprintf(fault, sizeof(fault), "unknown error");
        if (!quiet)
            progress(i + 1, n, ord, rows[i].problem, 1);
    }
    stof_close(&ctx);
    return EXIT_OK;
}

#define TD_NOT_OPENED (-1)

typedef struct td_shared {
    int next;               /* the next problem to hand out (atomic) */
    int done;               /* problems finished (atomic) */
    int current[TD_MAX_DEVICES]; /* each worker's problem, -1: none */
    int open_rc[TD_MAX_DEVICES]; /* 0: its GPU opened; TD_NOT_OPENED:
                                    the worker has not said */
    char open_msg[TD_MAX_DEVICES][300];
    int finished[];         /* per problem: 1 when its row is written */
} td_shared;

static void worker(td_shared *sh, tune_row *rows, int w, const stof_settings *s,
                   int ord, int n, td_problem_fn fn, void *user,
                   td_open_fn open_fn)
{
    stof_settings c = *s;
    c.device = ord;
    c.require_device = 1;
    stof_context *ctx = NULL;
    stof_status st = open_fn(&ctx, &c);
    if (st != STOF_OK) {
        snprintf(sh->open_msg[w], sizeof(sh->open_msg[w]), "%s",
                 stof_errmsg(ctx));
        __atomic_store_n(&sh->open_rc[w], exit_for(st), __ATOMIC_SEQ_CST);
        stof_close(&ctx);
        _exit(0);
    }
    __atomic_store_n(&sh->open_rc[w], 0, __ATOMIC_SEQ_CST); /* opened */
    for (;;) {
        int i = __atomic_fetch_add(&sh->next, 1, __ATOMIC_SEQ_CST);
        if (i >= n)
            break;
        __atomic_store_n(&sh->current[w], i, __ATOMIC_SEQ_CST);
        const double t0 = now_s();
        /* The shared row itself: the problem's name, set first, stays
         * when the worker dies on it. */
        tune_row *r = &rows[i];
        memset(r, 0, sizeof(*r));
        r->device = ord;
        const int failed = fn(user, ctx, i, r);
        r->plan_s = now_s() - t0;
        char fault[200] = "";
        if (failed && !gpu_alive(ctx, fault, sizeof(fault))) {
            /* This worker's GPU is unusable: it stops, and the other
             * workers take the problems left. */
            const size_t used = strlen(r->error);
            snprintf(r->error + used, sizeof(r->error) - used,
                     "%s(GPU %d then faulted: %s; its worker stopped)",
                     used ? " " : "", ord, fault);
            __atomic_store_n(&sh->finished[i], 1, __ATOMIC_SEQ_CST);
            __atomic_store_n(&sh->current[w], -1, __ATOMIC_SEQ_CST);
            __atomic_fetch_add(&sh->done, 1, __ATOMIC_SEQ_CST);
            _exit(0);
        }
        __atomic_store_n(&sh->finished[i], 1, __ATOMIC_SEQ_CST);
        __atomic_store_n(&sh->current[w], -1, __ATOMIC_SEQ_CST);
        __atomic_fetch_add(&sh->done, 1, __ATOMIC_SEQ_CST);
    }
    stof_close(&ctx);
    _exit(0);
}

/* Wait for the workers, showing progress; mark the problem of a worker
 * that died as failed. */
static void collect(td_shared *sh, tune_row *rows, const pid_t *pids,
                    const int *ords, int n_dev, int n, int quiet)
{
    int alive = n_dev, shown = 0;
    char *reported = calloc((size_t)n + 1, 1);
    while (alive > 0) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            for (int w = 0; w < n_dev; w++) {
                if (pids[w] != pid)
                    continue;
                alive--;
                int i = __atomic_load_n(&sh->current[w], __ATOMIC_SEQ_CST);
                if (i >= 0 && i < n && !sh->finished[i]) {
                    tune_row *r = &rows[i];
                    r->device = ords[w];
                    snprintf(r->error, sizeof(r->error),
                             "the worker on GPU %d died (%s %d) while "
                             "tuning this problem",
                             ords[w],
                             WIFSIGNALED(status) ? "signal" : "exit status",
                             WIFSIGNALED(status) ? WTERMSIG(status)
                                                 : WEXITSTATUS(status));
                    sh->finished[i] = 1;
                    sh->done++;
                }
            }
        } else if (pid < 0 && errno != EINTR) {
            break;
        } else {
            struct timespec t = {0, 100 * 1000 * 1000};
            nanosleep(&t, NULL);
        }
        for (int i = 0; !quiet && reported && i < n; i++)
            if (!reported[i] && __atomic_load_n(&sh->finished[i],
                                                __ATOMIC_SEQ_CST)) {
                reported[i] = 1;
                progress(++shown, n, rows[i].device, rows[i].problem, n_dev);
            }
    }
    free(reported);
}

int td_run(const stof_settings *s, const int *ords, int n_dev, int n,
           td_problem_fn fn, void *user, tune_row *rows, int quiet)
{
    if (n_dev <= 1)
        return run_here(s, ords[0], n, fn, user, rows, quiet);
    return td_run_with(s, ords, n_dev, n, fn, user, rows, quiet, stof_open);
}

int td_run_with(const stof_settings *s, const int *ords, int n_dev, int n,
                td_problem_fn fn, void *user, tune_row *rows, int quiet,
                td_open_fn open_fn)
{
    size_t shared = sizeof(td_shared) + sizeof(int) * (size_t)n;
    td_shared *sh = mmap(NULL, shared, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    tune_row *rw = mmap(NULL, sizeof(tune_row) * (size_t)(n ? n : 1),
                        PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                        -1, 0);
    if (sh == MAP_FAILED || rw == MAP_FAILED) {
        err("cannot share memory with the workers: %s", strerror(errno));
        return EXIT_FAIL;
    }
    memset(sh, 0, shared);
    memcpy(rw, rows, sizeof(tune_row) * (size_t)n);
    pid_t pids[TD_MAX_DEVICES];
    fflush(NULL);
    for (int w = 0; w < n_dev; w++) {
        sh->current[w] = -1;
        sh->open_rc[w] = TD_NOT_OPENED; /* until the worker says */
        pids[w] = fork();
        if (pids[w] == 0)
            worker(sh, rw, w, s, ords[w], n, fn, user, open_fn);
        if (pids[w] < 0) {
            snprintf(sh->open_msg[w], sizeof(sh->open_msg[w]), "fork: %s",
                     strerror(errno));
            sh->open_rc[w] = EXIT_FAIL;
            pids[w] = 0;
        }
    }
    collect(sh, rw, pids, ords, n_dev, n, quiet);
    int opened = 0, rc = EXIT_OK;
    for (int w = 0; w < n_dev; w++) {
        if (!sh->open_rc[w]) {
            opened++;
            continue;
        }
        if (sh->open_rc[w] == TD_NOT_OPENED) { /* died while opening */
            err("GPU %d: its worker died while opening the device", ords[w]);
            rc = EXIT_FAIL;
            continue;
        }
        err("GPU %d: %s", ords[w], sh->open_msg[w]);
        rc = sh->open_rc[w];
    }
    /* Problems nobody reached (every worker failed or died). */
    for (int i = 0; i < n; i++)
        if (!sh->finished[i] && !rw[i].error[0])
            snprintf(rw[i].error, sizeof(rw[i].error),
                     "not tuned: no worker was left to take it");
    memcpy(rows, rw, sizeof(tune_row) * (size_t)n);
    munmap(sh, shared);
    munmap(rw, sizeof(tune_row) * (size_t)(n ? n : 1));
    return opened ? EXIT_OK : rc;
}
