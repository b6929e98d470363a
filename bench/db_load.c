/*
 * db_load.c - stof-bench-dbload: a load test of the tuning database on a GPU
 * host. N worker processes (half in STOF_TUNE_CACHE_ONLY, half in
 * STOF_TUNE_DEFAULT) plan and run a random mix of masked-attention problems
 * against one user database, while the parent runs `stof-tune export`,
 * `import` (in place, so it takes the write lock) and `merge` on the same
 * file, for a fixed time. It then checks that nothing failed, that every
 * record present before the run and every record a worker tuned is in the
 * database, and that `PRAGMA integrity_check` is "ok" on the database and on
 * the last merged file; and prints the figures (plans per second, errors,
 * records before and after) as a table and, with --json, as JSON.
 *
 * This file owns the whole test: options, the GPU probe, the workers, the
 * stof-tune runs and the final checks. The CUDA state is only ever created
 * in child processes (a short-lived probe, then the workers), because a
 * CUDA context does not survive fork().
 *
 * Exit status: 0 pass, 1 fail (an error, a lost record or a bad integrity
 * check), 2 usage, 77 skipped (no GPU).
 */
#include "internal.h" /* ctx->api and stof__ctx_push/pop, for device buffers */

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>

#include <sqlite3.h>

#define PROG "stof-bench-dbload"
#define MAX_PROCS 256
/* Stragglers (a worker in the middle of a tune, a hung stof-tune) get this
 * long past the deadline before they are killed and counted as errors. */
#define GRACE_S 60.0
/* Tuning settings of the default-mode workers: cheap enough that one cold
 * tune takes seconds, not the whole run, but still a real search that
 * compiles, verifies, times and stores. */
#define TUNE_BUDGET_S 4.0
#define TUNE_TOP_K 1
#define TUNE_REPS 5
#define COMPILE_THREADS 2
/* Error messages printed per worker, and for the stof-tune runs in all. */
#define MAX_PRINTED 3
#define MAX_TOOL_PRINTED 5
/* Output elements copied back and checked at each of three places. */
#define CHECK_ELEMS 64

/* ------------------------------------------------------------------ */
/* Options and shared state                                            */
/* ------------------------------------------------------------------ */

typedef struct options {
    const char *db;        /* NULL: a new file under the temporary dir */
    int procs;
    double seconds;
    const char *stof_tune; /* NULL: look for it */
    const char *json;      /* NULL: no JSON */
    uint64_t seed;
} options;

/* What a worker counts; summed per tuning mode by the parent. */
typedef struct counts {
    long plans, runs, errors, warnings, hits, tuned, fallback;
    double seconds;
} counts;

/* A set of 32-hex-digit record keys (kept sorted after keys_unique). */
typedef struct keyset {
    char (*k)[33];
    size_t n, cap;
} keyset;

enum { CMD_EXPORT, CMD_IMPORT, CMD_MERGE, CMD_COUNT };
static const char *const cmd_names[CMD_COUNT] = {"export", "import", "merge"};

enum { MODE_CACHE_ONLY, MODE_DEFAULT, MODE_COUNT };

typedef struct run_state {
    options o;
    char tmpdir[PATH_MAX], db[PATH_MAX], snap[PATH_MAX], merged[PATH_MAX];
    char tool_err[PATH_MAX], tune[PATH_MAX], gpu[256];
    double t0, deadline, elapsed;
    pid_t pids[MAX_PROCS];
    char failed[MAX_PROCS]; /* the worker was already counted as failed */
    keyset before, tuned;
    counts mode[MODE_COUNT];
    long proc_errors; /* workers that crashed, hung or sent no report */
    long cmd_runs[CMD_COUNT], cmd_failed[CMD_COUNT];
    int tool_printed;
    long records_before, records_after, lost_before, lost_tuned;
    char integ_db[1024], integ_merged[1024];
} run_state;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int mode_of(int worker)
{
    /* Even workers tune, so that even --procs 1 writes to the database. */
    return worker % 2 ? MODE_CACHE_ONLY : MODE_DEFAULT;
}

static int keys_add(keyset *ks, const char *key)
{
    if (ks->n == ks->cap) {
        size_t cap = ks->cap ? 2 * ks->cap : 256;
        void *p = realloc(ks->k, cap * sizeof(*ks->k));
        if (!p)
            return -1;
        ks->k = p;
        ks->cap = cap;
    }
    snprintf(ks->k[ks->n++], sizeof(ks->k[0]), "%s", key);
    return 0;
}

static int cmp_key(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* Sort and drop duplicates: two workers may tune the same problem. */
static void keys_unique(keyset *ks)
{
    if (!ks->n)
        return;
    qsort(ks->k, ks->n, sizeof(*ks->k), cmp_key);
    size_t j = 1;
    for (size_t i = 1; i < ks->n; i++)
        if (strcmp(ks->k[i], ks->k[j - 1]))
            memcpy(ks->k[j++], ks->k[i], sizeof(ks->k[0]));
    ks->n = j;
}

/* ------------------------------------------------------------------ */
/* Option parsing                                                      */
/* ------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--db PATH] [--procs N] [--seconds S]\n"
            "                         [--stof-tune PATH] [--json FILE] "
            "[--seed N]\n"
            "\n"
            "Load test of the tuning database: N processes (half cache-only,\n"
            "half default tuning mode) plan and run a mix of masked-attention\n"
            "problems against one user database for S seconds, while\n"
            "`stof-tune export`, `import` and `merge` run on it beside them.\n"
            "Then checks: no error, no lost record, integrity_check ok.\n"
            "\n"
            "  --db PATH         the shared user database (default: a new "
            "file\n"
            "                    in a fresh temporary directory)\n"
            "  --procs N         worker processes, 1..%d (default 16)\n"
            "  --seconds S       how long the workers run (default 120)\n"
            "  --stof-tune PATH  the stof-tune program (default: "
            "../tools/stof-tune\n"
            "                    or stof-tune beside this program, else "
            "$STOF_TUNE,\n"
            "                    else the PATH)\n"
            "  --json FILE       also write the figures as JSON\n"
            "  --seed N          seed of the problem choice (default 1)\n"
            "  --help, --version\n"
            "\n"
            "exit status: 0 pass; 1 fail; 2 usage error; 77 skipped (no "
            "GPU).\n",
            MAX_PROCS);
}

static int bad_value(const char *opt, const char *want, const char *got)
{
    fprintf(stderr, PROG ": %s: expected %s, got '%s' (see --help)\n", opt,
            want, got);
    return 2;
}

/* Apply one option with its argument; 0 or an exit status (2). */
static int apply_option(options *o, int c, const char *arg)
{
    char *end = NULL;
    errno = 0;
    switch (c) {
    case 'd':
        if (!*arg)
            return bad_value("--db", "a path", arg);
        o->db = arg;
        return 0;
    case 'p': {
        long v = strtol(arg, &end, 10);
        if (errno || end == arg || *end || v < 1 || v > MAX_PROCS)
            return bad_value("--procs", "an integer from 1 to 256", arg);
        o->procs = (int)v;
        return 0;
    }
    case 's':
        o->seconds = strtod(arg, &end);
        if (errno || end == arg || *end || !(o->seconds > 0) ||
            o->seconds > 86400)
            return bad_value("--seconds", "a number of seconds above 0",
                             arg);
        return 0;
    case 't':
        o->stof_tune = arg;
        return 0;
    case 'j':
        o->json = arg;
        return 0;
    case 'r':
        o->seed = strtoull(arg, &end, 0);
        if (errno || end == arg || *end || *arg == '-')
            return bad_value("--seed", "an unsigned integer", arg);
        return 0;
    }
    return 2;
}

/* Parse argv into *o. Returns -1 to go on, else the exit status (0 after
 * --help or --version, 2 for a usage error). */
static int parse_options(int argc, char **argv, options *o)
{
    static const struct option longopts[] = {
        {"db", required_argument, NULL, 'd'},
        {"procs", required_argument, NULL, 'p'},
        {"seconds", required_argument, NULL, 's'},
        {"stof-tune", required_argument, NULL, 't'},
        {"json", required_argument, NULL, 'j'},
        {"seed", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    *o = (options){.procs = 16, .seconds = 120, .seed = 1};
    opterr = 0; /* our own one-line messages instead of getopt's */
    int c;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (c == 'V') {
            printf(PROG " %s\n", stof_version_string());
            return 0;
        }
        if (c == ':') {
            fprintf(stderr, PROG ": %s needs a value (see --help)\n",
                    argv[optind - 1]);
            return 2;
        }
        if (c == '?') {
            fprintf(stderr, PROG ": unknown option '%s' (see --help)\n",
                    argv[optind - 1]);
            return 2;
        }
        int rc = apply_option(o, c, optarg);
        if (rc)
            return rc;
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s' (see --help)\n",
                argv[optind]);
        return 2;
    }
    return -1;
}

/* ------------------------------------------------------------------ */
/* The GPU probe (in a child: the parent must not touch CUDA)          */
/* ------------------------------------------------------------------ */

/* Copy the string value of "name":"..." out of a flat JSON text; "" when
 * absent. Values stof writes here (sources, keys, GPU names) have no
 * escaped quotes. */
static void json_field(const char *json, const char *name, char *out,
                       size_t n)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":\"", name);
    const char *p = strstr(json, pat);
    out[0] = '\0';
    if (!p)
        return;
    p += strlen(pat);
    size_t len = strcspn(p, "\"");
    if (len >= n)
        len = n - 1;
    memcpy(out, p, len);
    out[len] = '\0';
}

/* The probe child's body: open a context that needs a device and write
 * the GPU's name (exit 0), or why there is none (77), or what else failed
 * (1) into fd. */
static int probe_child(int fd)
{
    stof_settings s;
    stof_default_settings(&s);
    s.require_device = 1;
    s.user_db = ""; /* the probe must not create or touch any database */
    stof_context *ctx = NULL;
    stof_status st = stof_open(&ctx, &s);
    char msg[1024], desc[4096];
    int code = 0;
    if (st == STOF_ERR_NO_DEVICE || (st == STOF_OK && !stof_has_device(ctx))) {
        snprintf(msg, sizeof(msg), "%s",
                 st == STOF_OK ? "stof_has_device() is 0" : stof_errmsg(ctx));
        code = 77;
    } else if (st != STOF_OK) {
        snprintf(msg, sizeof(msg), "cannot open a stof context: %s",
                 stof_errmsg(ctx));
        code = 1;
    } else if (stof_device_describe(ctx, desc, sizeof(desc), NULL) !=
               STOF_OK) {
        snprintf(msg, sizeof(msg), "stof_device_describe: %s",
                 stof_errmsg(ctx));
        code = 1;
    } else {
        json_field(desc, "name", msg, sizeof(msg));
    }
    if (write(fd, msg, strlen(msg)) < 0)
        code = 1;
    stof_close(&ctx);
    return code;
}

/* Run the probe in a child process. Returns 0 with the GPU name in gpu[],
 * 77 (no GPU) or 1 (an error), with the reason in why[]. */
static int probe_gpu(char *gpu, size_t gn, char *why, size_t wn)
{
    int fd[2];
    if (pipe(fd) != 0) {
        snprintf(why, wn, "pipe: %s", strerror(errno));
        return 1;
    }
    fflush(NULL); /* so the child cannot write our buffered output twice */
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, wn, "fork: %s", strerror(errno));
        close(fd[0]);
        close(fd[1]);
        return 1;
    }
    if (pid == 0) {
        close(fd[0]);
        _exit(probe_child(fd[1]));
    }
    close(fd[1]);
    char buf[1024];
    size_t len = 0;
    while (len < sizeof(buf) - 1) {
        ssize_t r = read(fd[0], buf + len, sizeof(buf) - 1 - len);
        if (r > 0)
            len += (size_t)r;
        else if (r == 0 || errno != EINTR)
            break;
    }
    buf[len] = '\0';
    close(fd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFSIGNALED(status)) {
        snprintf(why, wn, "the GPU probe was killed by signal %d (%s)",
                 WTERMSIG(status), strsignal(WTERMSIG(status)));
        return 1;
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    /* The GPU name may be cut to gpu[]'s size; that only shortens the
     * table's title. */
    char *dst = code == 0 ? gpu : why;
    size_t dn = code == 0 ? gn : wn, len_out = strlen(buf);
    if (len_out >= dn)
        len_out = dn - 1;
    memcpy(dst, buf, len_out);
    dst[len_out] = '\0';
    return code == 0 || code == 77 ? code : 1;
}

/* ------------------------------------------------------------------ */
/* Workers                                                              */
/* ------------------------------------------------------------------ */

/* One problem of the mix. */
typedef struct problem {
    const char *spec;
    int batch, heads, seq, head_dim;
    stof_dtype dtype;
} problem;

static const char *const mix_masks[] = {
    "causal", "sliding:256", "bigbird:64:3:2:3:1", "dilated:256:2",
    "strided:128",
};
static const int mix_seqs[] = {512, 1024, 2048};
#define MAX_ELEMS ((size_t)2 * 8 * 2048 * 128) /* the largest problem */

static problem pick_problem(uint64_t *rng)
{
    uint64_t r = splitmix64(rng);
    problem p;
    p.spec = mix_masks[r % 5];
    r /= 5;
    p.batch = 1 + (int)(r % 2);
    r /= 2;
    p.heads = r % 2 ? 8 : 4;
    r /= 2;
    p.seq = mix_seqs[r % 3];
    r /= 3;
    p.head_dim = r % 2 ? 128 : 64;
    r /= 2;
    p.dtype = r % 2 ? STOF_DTYPE_BF16 : STOF_DTYPE_FP16;
    return p;
}

typedef struct worker {
    int index, mode;
    stof_context *ctx;
    CUdeviceptr q, k, v, o;
    FILE *report;
    counts c;
    int printed;
    uint64_t rng;
    char what[128]; /* the problem in hand, for messages */
} worker;

/* Count an error and print the first few. */
static void worker_error(worker *w, const char *call, const char *msg)
{
    w->c.errors++;
    if (w->printed++ < MAX_PRINTED)
        fprintf(stderr, PROG ": worker %d (%s): %s%s%s: %s\n", w->index,
                w->mode == MODE_DEFAULT ? "default" : "cache-only", call,
                w->what[0] ? " " : "", w->what, msg);
}

/* Warnings about the database (a lookup, store or miss that failed, a
 * database skipped or opened read-only) are errors of this test: each one
 * can lose a record. Other warnings (a search candidate that did not
 * compile or verify, an NVRTC that cannot target the device) are counted
 * and the first few printed, but do not fail the run. Error-level
 * messages are ignored here: the failing call's status counts them. */
static void worker_log(void *user, stof_log_level level, const char *msg)
{
    worker *w = user;
    if (level != STOF_LOG_WARN)
        return;
    if (strstr(msg, "tuning database") || strstr(msg, "could not store") ||
        strstr(msg, "could not record") || strstr(msg, "tuning record"))
        worker_error(w, "database warning", msg);
    else if (w->c.warnings++ < MAX_PRINTED)
        fprintf(stderr, PROG ": worker %d: warning (not an error): %s\n",
                w->index, msg);
}

/* Record a failed driver call as an error; returns 0 when r is success. */
static int cu_check(worker *w, CUresult r, const char *call)
{
    if (r == CUDA_SUCCESS)
        return 0;
    const char *name = NULL;
    if (w->ctx->api->cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
        name = "unknown CUDA error";
    worker_error(w, call, name);
    return -1;
}

/* Fill a device buffer with small random values: finite in fp16 and bf16
 * alike (bit patterns below 0x3c00 with a random sign). */
static int fill_random(worker *w, CUdeviceptr dst, uint16_t *h)
{
    for (size_t i = 0; i < MAX_ELEMS; i++) {
        uint64_t r = splitmix64(&w->rng);
        h[i] = (uint16_t)((r % 0x3c00) | ((r >> 32) & 1 ? 0x8000 : 0));
    }
    return cu_check(w, w->ctx->api->cuMemcpyHtoD(dst, h, MAX_ELEMS * 2),
                    "cuMemcpyHtoD");
}

/* Allocate q, k, v, o for the largest problem of the mix and fill the
 * inputs. The primary context is stof's; the driver table is the one stof
 * loaded, so this program never links libcuda itself. */
static int worker_buffers(worker *w)
{
    const stof_api *api = w->ctx->api;
    uint16_t *h = malloc(MAX_ELEMS * 2);
    if (!h) {
        worker_error(w, "malloc", "out of host memory");
        return -1;
    }
    if (stof__ctx_push(w->ctx) != STOF_OK) {
        worker_error(w, "stof__ctx_push", stof_errmsg(w->ctx));
        free(h);
        return -1;
    }
    CUdeviceptr *bufs[4] = {&w->q, &w->k, &w->v, &w->o};
    int rc = 0;
    for (int i = 0; i < 4 && !rc; i++)
        rc = cu_check(w, api->cuMemAlloc(bufs[i], MAX_ELEMS * 2),
                      "cuMemAlloc");
    for (int i = 0; i < 3 && !rc; i++)
        rc = fill_random(w, *bufs[i], h);
    stof__ctx_pop(w->ctx);
    free(h);
    return rc;
}

static int worker_open(worker *w, const run_state *rs)
{
    stof_settings s;
    stof_default_settings(&s);
    s.require_device = 1;
    s.user_db = rs->db;
    s.tuning_mode = w->mode == MODE_DEFAULT ? STOF_TUNE_DEFAULT
                                            : STOF_TUNE_CACHE_ONLY;
    s.tuning_budget_s = TUNE_BUDGET_S;
    s.tuning_top_k = TUNE_TOP_K;
    s.tuning_reps = TUNE_REPS;
    s.compile_threads = COMPILE_THREADS;
    s.log_fn = worker_log;
    s.log_user = w;
    s.log_level = STOF_LOG_WARN;
    if (stof_open(&w->ctx, &s) != STOF_OK) {
        worker_error(w, "stof_open", stof_errmsg(w->ctx));
        return -1;
    }
    return worker_buffers(w);
}

static void worker_close(worker *w)
{
    if (w->ctx && stof_has_device(w->ctx) &&
        stof__ctx_push(w->ctx) == STOF_OK) {
        CUdeviceptr bufs[4] = {w->q, w->k, w->v, w->o};
        for (int i = 0; i < 4; i++)
            if (bufs[i])
                w->ctx->api->cuMemFree(bufs[i]);
        stof__ctx_pop(w->ctx);
    }
    stof_close(&w->ctx);
}

/* Note where the plan came from; a tuned plan's key goes to the report at
 * once, so that a worker that dies later still reports it. */
static void worker_note_source(worker *w, const stof_plan *p)
{
    char desc[16384], source[32], key[64];
    if (stof_plan_describe(p, desc, sizeof(desc), NULL) != STOF_OK) {
        worker_error(w, "stof_plan_describe", "failed");
        return;
    }
    json_field(desc, "source", source, sizeof(source));
    json_field(desc, "key", key, sizeof(key));
    if (!strcmp(source, "user db") || !strcmp(source, "system db")) {
        w->c.hits++;
    } else if (!strcmp(source, "fallback")) {
        w->c.fallback++;
    } else if (!strcmp(source, "tuned")) {
        w->c.tuned++;
        if (w->mode != MODE_DEFAULT)
            worker_error(w, "stof_attention_plan",
                         "a cache-only plan was tuned");
        if (strlen(key) != 32)
            worker_error(w, "stof_plan_describe", "tuned plan without a key");
        else {
            fprintf(w->report, "tuned %s\n", key);
            fflush(w->report);
        }
    }
}

/* 1 when an fp16 / bf16 bit pattern is Inf or NaN (exponent all ones). */
static int not_finite(uint16_t x, stof_dtype dt)
{
    uint16_t e = dt == STOF_DTYPE_FP16 ? 0x7c00 : 0x7f80;
    return (x & e) == e;
}

/* Run the plan once on an output poisoned with NaN, synchronise and check
 * samples of the output (start, middle, end) for NaN/Inf: an unwritten or
 * broken output fails. */
static void worker_run(worker *w, stof_plan *p, const problem *pb)
{
    const stof_api *api = w->ctx->api;
    const size_t elems = (size_t)pb->batch * pb->heads * pb->seq *
                         pb->head_dim;
    if (stof__ctx_push(w->ctx) != STOF_OK) {
        worker_error(w, "stof__ctx_push", stof_errmsg(w->ctx));
        return;
    }
    int rc = cu_check(w, api->cuMemsetD8(w->o, 0xff, elems * 2), "cuMemsetD8");
    stof__ctx_pop(w->ctx);
    if (rc)
        return;
    if (stof_attention_run(p, (const void *)(uintptr_t)w->q,
                           (const void *)(uintptr_t)w->k,
                           (const void *)(uintptr_t)w->v,
                           (void *)(uintptr_t)w->o, NULL) != STOF_OK) {
        worker_error(w, "stof_attention_run", stof_plan_errmsg(p));
        return;
    }
    uint16_t h[3][CHECK_ELEMS];
    const size_t at[3] = {0, elems / 2, elems - CHECK_ELEMS};
    if (stof__ctx_push(w->ctx) != STOF_OK) {
        worker_error(w, "stof__ctx_push", stof_errmsg(w->ctx));
        return;
    }
    rc = cu_check(w, api->cuCtxSynchronize(), "cuCtxSynchronize");
    for (int i = 0; i < 3 && !rc; i++)
        rc = cu_check(w,
                      api->cuMemcpyDtoH(h[i], w->o + at[i] * 2,
                                        sizeof(h[i])),
                      "cuMemcpyDtoH");
    stof__ctx_pop(w->ctx);
    if (rc)
        return;
    w->c.runs++;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < CHECK_ELEMS; j++)
            if (not_finite(h[i][j], pb->dtype)) {
                worker_error(w, "check", "the output is not finite");
                return;
            }
}

/* Plan and run one random problem of the mix. */
static void worker_step(worker *w)
{
    problem pb = pick_problem(&w->rng);
    snprintf(w->what, sizeof(w->what), "%s %dx%dx%dx%d %s", pb.spec,
             pb.batch, pb.heads, pb.seq, pb.head_dim,
             pb.dtype == STOF_DTYPE_FP16 ? "fp16" : "bf16");
    stof_mask *m = NULL;
    stof_plan *p = NULL;
    stof_attention_desc d;
    if (stof_mask_from_spec(w->ctx, pb.spec, pb.seq, pb.seq, &m) != STOF_OK) {
        worker_error(w, "stof_mask_from_spec", stof_errmsg(w->ctx));
        goto out;
    }
    stof_attention_desc_init(&d, pb.batch, pb.heads, pb.seq, pb.seq,
                             pb.head_dim, pb.dtype, STOF_LAYOUT_BHSD);
    if (stof_attention_plan(w->ctx, &d, m, &p) != STOF_OK) {
        worker_error(w, "stof_attention_plan", stof_errmsg(w->ctx));
        goto out;
    }
    w->c.plans++;
    worker_note_source(w, p);
    worker_run(w, p, &pb);
out:
    stof_plan_free(&p);
    stof_mask_free(&m);
    w->what[0] = '\0';
}

/* A worker process: plan and run until the deadline, then report its
 * counts as the last line of its report file. Never returns. */
static void worker_main(const run_state *rs, int index, const char *path)
{
    worker w = {.index = index, .mode = mode_of(index)};
    /* The worker's stream starts at the index-th output of the seed's
     * stream: outputs are hashed, so the workers' streams do not overlap
     * (seeds that differ by a multiple of splitmix64's increment would give
     * the same sequence shifted, and every worker the same problems). */
    uint64_t s = rs->o.seed;
    for (int i = 0; i <= index; i++)
        w.rng = splitmix64(&s);
    w.report = fopen(path, "w");
    if (!w.report) {
        fprintf(stderr, PROG ": worker %d: cannot write %s: %s\n", index, path,
                strerror(errno));
        _exit(1);
    }
    const double t0 = now_s();
    if (worker_open(&w, rs) == 0)
        while (now_s() < rs->deadline)
            worker_step(&w);
    worker_close(&w);
    w.c.seconds = now_s() - t0;
    fprintf(w.report,
            "counts plans=%ld runs=%ld errors=%ld warnings=%ld hits=%ld "
            "tuned=%ld fallback=%ld seconds=%.3f\n",
            w.c.plans, w.c.runs, w.c.errors, w.c.warnings, w.c.hits,
            w.c.tuned, w.c.fallback, w.c.seconds);
    int bad = fclose(w.report) != 0;
    _exit(bad);
}

static void report_path(const run_state *rs, int i, char *out, size_t n)
{
    snprintf(out, n, "%s/worker-%03d.txt", rs->tmpdir, i);
}

static int start_workers(run_state *rs)
{
    for (int i = 0; i < rs->o.procs; i++) {
        char path[PATH_MAX + 32];
        report_path(rs, i, path, sizeof(path));
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, PROG ": fork of worker %d: %s\n", i,
                    strerror(errno));
            rs->proc_errors++;
            /* The started workers would run to the deadline for nothing:
             * stop them now (wait_workers counts them as killed). */
            for (int j = 0; j < i; j++)
                kill(rs->pids[j], SIGTERM);
            return -1;
        }
        if (pid == 0)
            worker_main(rs, i, path);
        rs->pids[i] = pid;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* stof-tune beside the workers                                         */
/* ------------------------------------------------------------------ */

static int executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
           access(path, X_OK) == 0;
}

/* Find stof-tune: --stof-tune, else ../tools/stof-tune or stof-tune beside
 * this program (a build tree, or .carry/bin), else $STOF_TUNE, else the
 * PATH. Returns 0 with the path in rs->tune, else prints why. */
static int find_stof_tune(run_state *rs)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (rs->o.stof_tune) {
        if (executable(rs->o.stof_tune)) {
            snprintf(rs->tune, sizeof(rs->tune), "%s", rs->o.stof_tune);
            return 0;
        }
        fprintf(stderr, PROG ": --stof-tune %s: not an executable file\n",
                rs->o.stof_tune);
        return -1;
    }
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash)
            *slash = '\0';
        const char *const rel[] = {"../tools/stof-tune", "stof-tune"};
        for (int i = 0; i < 2; i++)
            if (snprintf(rs->tune, sizeof(rs->tune), "%s/%s", self, rel[i]) <
                    (int)sizeof(rs->tune) &&
                executable(rs->tune))
                return 0;
    }
    const char *env = getenv("STOF_TUNE");
    if (env && *env && executable(env) && strlen(env) < sizeof(rs->tune)) {
        snprintf(rs->tune, sizeof(rs->tune), "%s", env);
        return 0;
    }
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t len = strcspn(path, ":");
        snprintf(rs->tune, sizeof(rs->tune), "%.*s/stof-tune", (int)len, path);
        if (len && executable(rs->tune))
            return 0;
        path += len + (path[len] == ':');
    }
    fprintf(stderr, PROG ": cannot find stof-tune (pass --stof-tune PATH or "
                    "set STOF_TUNE)\n");
    return -1;
}

/* Wait for `pid` until `kill_at` (monotonic seconds), then kill it.
 * Returns 1 when it ended by itself, 0 when it had to be killed. */
static int wait_until(pid_t pid, double kill_at, int *status)
{
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid)
            return 1;
        if (r < 0 && errno != EINTR)
            return 1; /* not our child any more: nothing left to wait for */
        if (now_s() >= kill_at) {
            kill(pid, SIGKILL);
            while (waitpid(pid, status, 0) < 0 && errno == EINTR)
                ;
            return 0;
        }
        sleep_s(0.01);
    }
}

/* The first line of the last stof-tune's stderr, for the error message. */
static void first_line(const char *path, char *out, size_t n)
{
    FILE *f = fopen(path, "r");
    out[0] = '\0';
    if (f) {
        if (fgets(out, (int)n, f))
            out[strcspn(out, "\n")] = '\0';
        fclose(f);
    }
    if (!out[0])
        snprintf(out, n, "(no message)");
}

/* Run one stof-tune command with fork/exec, its stdout discarded and its
 * stderr kept in rs->tool_err; count the run and, unless it exits 0, the
 * failure. */
static void run_tool(run_state *rs, int which)
{
    const char *argv[8] = {rs->tune, cmd_names[which]};
    if (which == CMD_EXPORT)
        memcpy(argv + 2, (const char *[]){"--db", rs->db, "-o", rs->snap},
               4 * sizeof(char *));
    else if (which == CMD_IMPORT)
        memcpy(argv + 2, (const char *[]){rs->snap, "--db", rs->db},
               3 * sizeof(char *));
    else
        memcpy(argv + 2, (const char *[]){rs->db, rs->snap, "-o", rs->merged},
               4 * sizeof(char *));
    rs->cmd_runs[which]++;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int out = open("/dev/null", O_WRONLY);
        int err = open(rs->tool_err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (out >= 0)
            dup2(out, 1);
        if (err >= 0)
            dup2(err, 2);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    char why[512];
    int status = 0;
    if (pid < 0)
        snprintf(why, sizeof(why), "fork: %s", strerror(errno));
    else if (!wait_until(pid, rs->deadline + GRACE_S, &status))
        snprintf(why, sizeof(why), "still running %.0f s past the deadline: "
                                   "killed", GRACE_S);
    else if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return;
    else {
        char line[400];
        first_line(rs->tool_err, line, sizeof(line));
        if (WIFSIGNALED(status))
            snprintf(why, sizeof(why), "killed by signal %d: %s",
                     WTERMSIG(status), line);
        else
            snprintf(why, sizeof(why), "exit %d: %s", WEXITSTATUS(status),
                     line);
    }
    rs->cmd_failed[which]++;
    if (rs->tool_printed++ < MAX_TOOL_PRINTED)
        fprintf(stderr, PROG ": stof-tune %s: %s\n", cmd_names[which], why);
}

/* Open a database read-only. Returns 1 when the file does not exist, 0 on
 * success, -1 with the reason in why[]. */
static int db_open_ro(const char *path, sqlite3 **db, char *why, size_t n)
{
    struct stat st;
    *db = NULL;
    if (stat(path, &st) != 0 && errno == ENOENT)
        return 1;
    int rc = sqlite3_open_v2(path, db, SQLITE_OPEN_READONLY, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_busy_timeout(*db, 10000);
    if (rc != SQLITE_OK) {
        snprintf(why, n, "%s: %s", path,
                 *db ? sqlite3_errmsg(*db) : sqlite3_errstr(rc));
        sqlite3_close(*db);
        *db = NULL;
        return -1;
    }
    return 0;
}

/* 1 when the database has its `records` table (stof created its schema). */
static int db_has_records(sqlite3 *db)
{
    sqlite3_stmt *s = NULL;
    int yes = sqlite3_prepare_v2(db,
                                 "SELECT 1 FROM sqlite_master WHERE "
                                 "type = 'table' AND name = 'records'",
                                 -1, &s, NULL) == SQLITE_OK &&
              sqlite3_step(s) == SQLITE_ROW;
    sqlite3_finalize(s);
    return yes;
}

/* The stof-tune commands need a stof database: the first worker to plan
 * creates it. Until its schema exists there is nothing to export. */
static int db_ready(const char *path)
{
    sqlite3 *db = NULL;
    char why[512];
    if (db_open_ro(path, &db, why, sizeof(why)) != 0)
        return 0;
    int yes = db_has_records(db);
    sqlite3_close(db);
    return yes;
}

/* export, import, merge, again and again until the deadline. */
static void command_loop(run_state *rs)
{
    while (now_s() < rs->deadline) {
        if (!db_ready(rs->db)) {
            sleep_s(0.2);
            continue;
        }
        for (int c = 0; c < CMD_COUNT && now_s() < rs->deadline; c++)
            run_tool(rs, c);
    }
}

/* ------------------------------------------------------------------ */
/* After the deadline: reports and checks                              */
/* ------------------------------------------------------------------ */

/* Reap the workers; kill those still running GRACE_S past the deadline.
 * A worker killed by a signal or exiting non-zero is an error. */
static void wait_workers(run_state *rs)
{
    for (int i = 0; i < rs->o.procs; i++) {
        if (rs->pids[i] <= 0) { /* never started: fork failed */
            rs->failed[i] = 1;
            continue;
        }
        int status = 0;
        const long before = rs->proc_errors;
        if (!wait_until(rs->pids[i], rs->deadline + GRACE_S, &status)) {
            fprintf(stderr,
                    PROG ": worker %d: still running %.0f s past the "
                         "deadline: killed\n",
                    i, GRACE_S);
            rs->proc_errors++;
        } else if (WIFSIGNALED(status)) {
            fprintf(stderr, PROG ": worker %d: killed by signal %d (%s)\n", i,
                    WTERMSIG(status), strsignal(WTERMSIG(status)));
            rs->proc_errors++;
        } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
            fprintf(stderr, PROG ": worker %d: exit status %d\n", i,
                    WEXITSTATUS(status));
            rs->proc_errors++;
        }
        rs->failed[i] = rs->proc_errors != before;
        rs->pids[i] = 0;
    }
    rs->elapsed = now_s() - rs->t0;
}

/* Add one worker's report to the totals: its tuned keys and counts. */
static void read_report(run_state *rs, int i)
{
    char path[PATH_MAX + 32], line[512], key[64];
    report_path(rs, i, path, sizeof(path));
    FILE *f = fopen(path, "r");
    int have_counts = 0;
    while (f && fgets(line, sizeof(line), f)) {
        counts c = {0};
        if (sscanf(line, "tuned %63s", key) == 1 && strlen(key) == 32) {
            if (keys_add(&rs->tuned, key) != 0)
                rs->proc_errors++;
        } else if (sscanf(line,
                          "counts plans=%ld runs=%ld errors=%ld "
                          "warnings=%ld hits=%ld tuned=%ld fallback=%ld "
                          "seconds=%lf",
                          &c.plans, &c.runs, &c.errors, &c.warnings, &c.hits,
                          &c.tuned, &c.fallback, &c.seconds) == 8) {
            counts *t = &rs->mode[mode_of(i)];
            t->plans += c.plans, t->runs += c.runs, t->errors += c.errors;
            t->warnings += c.warnings, t->hits += c.hits;
            t->tuned += c.tuned, t->fallback += c.fallback;
            have_counts = 1;
        }
    }
    if (f)
        fclose(f);
    /* A worker that crashed or was killed is already counted once. */
    if (!have_counts && !rs->failed[i]) {
        fprintf(stderr, PROG ": worker %d: no counts in %s\n", i, path);
        rs->proc_errors++;
    }
}

/* PRAGMA integrity_check into out[]: "ok", or its first message (and how
 * many more), or why it could not run. Returns 1 when "ok". */
static int integrity(const char *path, char *out, size_t n)
{
    sqlite3 *db = NULL;
    char why[512];
    int rc = db_open_ro(path, &db, why, sizeof(why));
    if (rc != 0) {
        snprintf(out, n, "%s", rc > 0 ? "missing" : why);
        return 0;
    }
    sqlite3_stmt *s = NULL;
    int rows = 0;
    out[0] = '\0';
    if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, NULL) ==
        SQLITE_OK) {
        while ((rc = sqlite3_step(s)) == SQLITE_ROW)
            if (rows++ == 0)
                snprintf(out, n, "%s", (const char *)sqlite3_column_text(s, 0));
        if (rc != SQLITE_DONE)
            snprintf(out, n, "integrity_check: %s", sqlite3_errmsg(db));
    } else {
        snprintf(out, n, "integrity_check: %s", sqlite3_errmsg(db));
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    int ok = rows == 1 && !strcmp(out, "ok");
    if (rows > 1) {
        size_t len = strlen(out);
        snprintf(out + len, n - len, " (and %d more)", rows - 1);
    }
    return ok;
}

/* Read every record key of the database into ks; a missing file or one
 * without the schema is an empty set. Returns 0, or -1 with why[]. */
static int db_keys(const char *path, keyset *ks, char *why, size_t n)
{
    sqlite3 *db = NULL;
    int rc = db_open_ro(path, &db, why, n);
    if (rc != 0)
        return rc > 0 ? 0 : -1;
    sqlite3_stmt *s = NULL;
    rc = SQLITE_DONE;
    if (db_has_records(db)) {
        rc = sqlite3_prepare_v2(db, "SELECT key FROM records", -1, &s, NULL);
        if (rc == SQLITE_OK)
            while ((rc = sqlite3_step(s)) == SQLITE_ROW)
                if (keys_add(ks, (const char *)sqlite3_column_text(s, 0))) {
                    snprintf(why, n, "out of memory");
                    rc = SQLITE_NOMEM;
                    break;
                }
    }
    if (rc != SQLITE_DONE && !why[0])
        snprintf(why, n, "%s: reading the records: %s", path,
                 sqlite3_errmsg(db));
    sqlite3_finalize(s);
    sqlite3_close(db);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* How many keys of ks are not in the database (all of them when it cannot
 * be read). */
static long count_lost(sqlite3 *db, const keyset *ks)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db, "SELECT 1 FROM records WHERE key = ?", -1, &s,
                           NULL) != SQLITE_OK)
        return (long)ks->n;
    long lost = 0;
    for (size_t i = 0; i < ks->n; i++) {
        sqlite3_reset(s);
        sqlite3_bind_text(s, 1, ks->k[i], -1, SQLITE_STATIC);
        if (sqlite3_step(s) != SQLITE_ROW) {
            if (lost++ < MAX_TOOL_PRINTED)
                fprintf(stderr, PROG ": record %s is missing\n", ks->k[i]);
        }
    }
    sqlite3_finalize(s);
    return lost;
}

/* The checks on the database after the run. Returns 1 when they pass. */
static int final_checks(run_state *rs)
{
    int ok = integrity(rs->db, rs->integ_db, sizeof(rs->integ_db));
    ok &= integrity(rs->merged, rs->integ_merged, sizeof(rs->integ_merged));
    keys_unique(&rs->tuned);
    sqlite3 *db = NULL;
    char why[512] = "";
    rs->records_after = 0;
    if (db_open_ro(rs->db, &db, why, sizeof(why)) != 0 || !db_has_records(db)) {
        fprintf(stderr, PROG ": %s: cannot read the records: %s\n", rs->db,
                why[0] ? why : "no stof schema");
        rs->lost_before = (long)rs->before.n;
        rs->lost_tuned = (long)rs->tuned.n;
        sqlite3_close(db);
        return 0;
    }
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM records", -1, &s, NULL) ==
            SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW)
        rs->records_after = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    rs->lost_before = count_lost(db, &rs->before);
    rs->lost_tuned = count_lost(db, &rs->tuned);
    sqlite3_close(db);
    return ok && rs->lost_before == 0 && rs->lost_tuned == 0;
}

/* ------------------------------------------------------------------ */
/* Figures                                                              */
/* ------------------------------------------------------------------ */

static long total_errors(const run_state *rs)
{
    long e = rs->proc_errors;
    for (int m = 0; m < MODE_COUNT; m++)
        e += rs->mode[m].errors;
    for (int c = 0; c < CMD_COUNT; c++)
        e += rs->cmd_failed[c];
    return e;
}

static double per_s(long n, double s)
{
    return s > 0 ? n / s : 0.0;
}

static void print_table(const run_state *rs, int pass)
{
    const counts *co = &rs->mode[MODE_CACHE_ONLY];
    const counts *de = &rs->mode[MODE_DEFAULT];
    const double t = rs->elapsed;
#define ROW3(name, a, b)                                                       \
    printf("%-22s %10ld %12ld %10ld\n", name, (a) + (b), (a), (b))
    printf(PROG ": %d processes, %.0f s, GPU %s, seed %llu\n", rs->o.procs,
           rs->o.seconds, rs->gpu, (unsigned long long)rs->o.seed);
    printf("database %s\n\n", rs->db);
    printf("%-22s %10s %12s %10s\n", "", "total", "cache-only", "default");
    ROW3("plans", co->plans, de->plans);
    printf("%-22s %10.2f %12.2f %10.2f\n", "plans/s",
           per_s(co->plans + de->plans, t), per_s(co->plans, t),
           per_s(de->plans, t));
    ROW3("runs", co->runs, de->runs);
    ROW3("database hits", co->hits, de->hits);
    ROW3("fallbacks", co->fallback, de->fallback);
    ROW3("tuned", co->tuned, de->tuned);
    ROW3("errors", co->errors, de->errors);
    ROW3("other warnings", co->warnings, de->warnings);
#undef ROW3
    printf("%-22s %10ld\n", "worker failures", rs->proc_errors);
    printf("\n%-22s %10s %12s\n", "stof-tune", "runs", "failed");
    for (int c = 0; c < CMD_COUNT; c++)
        printf("%-22s %10ld %12ld\n", cmd_names[c], rs->cmd_runs[c],
               rs->cmd_failed[c]);
    printf("\nelapsed %.1f s; errors %ld\n", t, total_errors(rs));
    printf("records before %ld, after %ld; tuned keys %zu\n",
           rs->records_before, rs->records_after, rs->tuned.n);
    printf("lost records: %ld of those before, %ld of those tuned\n",
           rs->lost_before, rs->lost_tuned);
    printf("integrity_check: database %s, merged %s\n", rs->integ_db,
           rs->integ_merged);
    printf("result: %s\n", pass ? "PASS" : "FAIL");
}

/* Write s as a JSON string. */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void json_counts(FILE *f, const char *name, const counts *c, double t)
{
    fprintf(f,
            "\"%s\":{\"plans\":%ld,\"plans_per_s\":%.3f,\"runs\":%ld,"
            "\"hits\":%ld,\"fallbacks\":%ld,\"tuned\":%ld,\"errors\":%ld,"
            "\"other_warnings\":%ld}",
            name, c->plans, per_s(c->plans, t), c->runs, c->hits, c->fallback,
            c->tuned, c->errors, c->warnings);
}

static int write_json(const run_state *rs, int pass)
{
    FILE *f = fopen(rs->o.json, "w");
    if (!f) {
        fprintf(stderr, PROG ": cannot write %s: %s\n", rs->o.json,
                strerror(errno));
        return -1;
    }
    const counts *co = &rs->mode[MODE_CACHE_ONLY];
    const counts *de = &rs->mode[MODE_DEFAULT];
    counts all = {co->plans + de->plans, co->runs + de->runs,
                  co->errors + de->errors, co->warnings + de->warnings,
                  co->hits + de->hits, co->tuned + de->tuned,
                  co->fallback + de->fallback, 0};
    fprintf(f, "{\"procs\":%d,\"seconds\":%g,\"elapsed_s\":%.3f,\"seed\":%llu,"
               "\"gpu\":",
            rs->o.procs, rs->o.seconds, rs->elapsed,
            (unsigned long long)rs->o.seed);
    json_str(f, rs->gpu);
    fputs(",\"db\":", f);
    json_str(f, rs->db);
    fputc(',', f);
    json_counts(f, "all", &all, rs->elapsed);
    fputc(',', f);
    json_counts(f, "cache_only", co, rs->elapsed);
    fputc(',', f);
    json_counts(f, "default", de, rs->elapsed);
    fprintf(f, ",\"worker_failures\":%ld,\"commands\":{", rs->proc_errors);
    for (int c = 0; c < CMD_COUNT; c++)
        fprintf(f, "%s\"%s\":{\"runs\":%ld,\"failed\":%ld}", c ? "," : "",
                cmd_names[c], rs->cmd_runs[c], rs->cmd_failed[c]);
    fprintf(f,
            "},\"errors\":%ld,\"records_before\":%ld,\"records_after\":%ld,"
            "\"tuned_keys\":%zu,\"lost_records\":%ld,\"lost_before\":%ld,"
            "\"lost_tuned\":%ld,\"integrity\":{\"db\":",
            total_errors(rs), rs->records_before, rs->records_after,
            rs->tuned.n, rs->lost_before + rs->lost_tuned, rs->lost_before,
            rs->lost_tuned);
    json_str(f, rs->integ_db);
    fputs(",\"merged\":", f);
    json_str(f, rs->integ_merged);
    fprintf(f, "},\"result\":\"%s\"}\n", pass ? "pass" : "fail");
    return fclose(f) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* Setup, cleanup, main                                                */
/* ------------------------------------------------------------------ */

/* A fresh temporary directory for the snapshot, the merged file, the
 * reports and (without --db) the database itself. */
static int setup_paths(run_state *rs)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(rs->tmpdir, sizeof(rs->tmpdir), "%s/stof-dbload-XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(rs->tmpdir)) {
        fprintf(stderr, PROG ": cannot make a directory %s: %s\n",
                rs->tmpdir, strerror(errno));
        return -1;
    }
    if (strlen(rs->tmpdir) + 32 >= sizeof(rs->snap) ||
        (rs->o.db && strlen(rs->o.db) >= sizeof(rs->db))) {
        fprintf(stderr, PROG ": %s: path too long\n",
                rs->o.db ? rs->o.db : rs->tmpdir);
        rmdir(rs->tmpdir);
        return -1;
    }
    if (rs->o.db)
        snprintf(rs->db, sizeof(rs->db), "%s", rs->o.db);
    else
        snprintf(rs->db, sizeof(rs->db), "%s/tuning.db", rs->tmpdir);
    snprintf(rs->snap, sizeof(rs->snap), "%s/snapshot.db", rs->tmpdir);
    snprintf(rs->merged, sizeof(rs->merged), "%s/merged.db", rs->tmpdir);
    snprintf(rs->tool_err, sizeof(rs->tool_err), "%s/stof-tune.err",
             rs->tmpdir);
    return 0;
}

/* Remove the temporary directory and everything in it (it holds only what
 * this run made: reports, snapshots, stof-tune's temporary files and, when
 * --db was not given, the database). */
static void remove_tmpdir(const run_state *rs)
{
    DIR *d = opendir(rs->tmpdir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[PATH_MAX + 256];
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof(path), "%s/%s", rs->tmpdir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(rs->tmpdir);
}

/* The run itself, after the probe: returns the exit status. */
static int load_test(run_state *rs)
{
    char why[1024] = "";
    if (find_stof_tune(rs) != 0 || setup_paths(rs) != 0)
        return 1;
    if (db_keys(rs->db, &rs->before, why, sizeof(why)) != 0) {
        fprintf(stderr, PROG ": %s\n", why);
        remove_tmpdir(rs);
        return 1;
    }
    keys_unique(&rs->before);
    rs->records_before = (long)rs->before.n;
    printf(PROG ": %d processes for %.0f s on %s; database %s; stof-tune "
                "%s\n",
           rs->o.procs, rs->o.seconds, rs->gpu, rs->db, rs->tune);
    rs->t0 = now_s();
    rs->deadline = rs->t0 + rs->o.seconds;
    if (start_workers(rs) == 0)
        command_loop(rs);
    wait_workers(rs);
    for (int i = 0; i < rs->o.procs; i++)
        read_report(rs, i);
    int pass = final_checks(rs);
    pass = pass && total_errors(rs) == 0;
    print_table(rs, pass);
    if (rs->o.json && write_json(rs, pass) != 0)
        pass = 0;
    if (pass)
        remove_tmpdir(rs);
    else
        printf("files kept in %s\n", rs->tmpdir);
    return pass ? 0 : 1;
}

int main(int argc, char **argv)
{
    static run_state rs;
    int rc = parse_options(argc, argv, &rs.o);
    if (rc >= 0)
        return rc;
    char why[1024] = "";
    rc = probe_gpu(rs.gpu, sizeof(rs.gpu), why, sizeof(why));
    if (rc == 77) {
        printf(PROG ": skipped: no GPU (%s)\n", why);
        return 77;
    }
    if (rc != 0) {
        fprintf(stderr, PROG ": %s\n", why);
        return 1;
    }
    rc = load_test(&rs);
    free(rs.before.k);
    free(rs.tuned.k);
    return rc;
}
