/*
 * stof-tune - prebuild tuning databases and share them across hosts.
 *
 *   tune      tune the problems of a workload file (or --mask/--shape),
 *             on one GPU or spread over several (--devices)
 *   pending   tune the misses recorded by cache-only runs
 *   ls        list the records of a database
 *   show      one record in full
 *   stats     what a database holds: by GPU, op, mask, age; hits, misses
 *   export    copy records (optionally one GPU/driver) into a new file
 *   import    merge database files into the user (or --db) database
 *   merge     merge database files into a new file
 *   verify    re-check this GPU's records against the reference
 *   gc        drop records made by other stof or template versions
 *   doctor    which libraries, GPUs and databases stof uses here (and why)
 *   show-mask a mask's tiles as the kernels see them, and its picture
 *   hf-workload the workload of a Hugging Face model's decoder layers
 *
 * This file holds the command table, option parsing (getopt_long), the
 * mapping from statuses to exit codes, and the cleanup of temporary output
 * files when a signal ends the program. The commands live in
 * tune_dbcmd.c (database files) and tune_gpucmd.c (GPU work).
 *
 * Exit status: 0 ok, 1 failure (bad input file, a problem or record
 * failed), 2 usage, 3 no GPU, 4 database error. Every error is one line on
 * stderr, escaped for the terminal.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db.h"
#include "db_outfile.h"
#include "internal.h"
#include "tune_cli.h"
#include "tune_text.h"

/* ---------------------------------------- temporaries and signals */

/* Temporary outputs alive now. The handler only reads this table and
 * calls unlink, which is async-signal-safe; the names with their suffixes
 * are prepared when a file is registered. */
#define TMP_SLOTS 4
static char tmp_names[TMP_SLOTS][4][4096];
static volatile sig_atomic_t tmp_used[TMP_SLOTS];

void cli_tmp(void *user, const char *path, int created)
{
    (void)user;
    static const char *const sfx[4] = {"-wal", "-shm", "-journal", ""};
    for (int i = 0; i < TMP_SLOTS; i++) {
        if (created && !tmp_used[i]) {
            for (int k = 0; k < 4; k++)
                snprintf(tmp_names[i][k], sizeof(tmp_names[i][k]), "%s%s",
                         path, sfx[k]);
            tmp_used[i] = 1;
            return;
        }
        if (!created && tmp_used[i] && !strcmp(tmp_names[i][3], path)) {
            tmp_used[i] = 0;
            return;
        }
    }
}

static void on_signal(int sig)
{
    for (int i = 0; i < TMP_SLOTS; i++)
        if (tmp_used[i])
            for (int k = 0; k < 4; k++)
                (void)unlink(tmp_names[i][k]);
    /* Die of the same signal, so the caller sees how the program ended. */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_signals(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof(sigs) / sizeof(*sigs); i++)
        sigaction(sigs[i], &sa, NULL);
    /* A file larger than the process may write makes write() fail with
     * EFBIG instead of killing the program: the write fails, the
     * temporary is removed, and the error is reported. */
    signal(SIGXFSZ, SIG_IGN);
}

/* ------------------------------------------------------------ commands */

typedef struct command {
    const char *name;
    int (*fn)(stof_context *, const opts *);
    const char *allowed; /* option names, space separated */
    int min_pos, max_pos;
    const char *usage;
} command;

static const command commands[] = {
    {"tune", cmd_tune,
     "db mask shape layer tokens dtype layout force budget json devices "
     "dry-run",
     0, 1,
     "usage: stof-tune tune WORKLOAD [options]\n"
     "       stof-tune tune --mask SPEC --shape SHAPE [options]\n"
     "       stof-tune tune --mask SPEC --layer LAYER --tokens BxS [options]\n"
     "\n"
     "Tune every problem of a workload file (masks x shapes x dtypes;\n"
     "format in examples/suite.workload; Transformer layers x tokens x\n"
     "masks x dtypes with 'layer' and 'tokens' lines, as in\n"
     "examples/layers.workload) into the user database or --db, then\n"
     "print a table: problem, kernel (a layer: \"layer\", its time the\n"
     "whole layer's), time, speed-up over the cost model's first choice,\n"
     "source (tuned, user db, system db; a layer: tuned or database). The\n"
     "GPU is checked first; each mask is built when its problem is tuned.\n"
     "--mask, --shape, --layer, --tokens, --dtype and --layout describe\n"
     "problems without a file (with one they are refused).\n"
     "\n"
     "  --mask SPEC      a mask spec (repeatable), e.g. sliding:256\n"
     "  --shape SHAPE    BxHxNxD or BxHxSQxSKxD (repeatable)\n"
     "  --layer LAYER    a layer, as after 'layer' in a workload file, e.g.\n"
     "                   'bert hidden=768 heads=12 act=gelu_erf' (repeatable)\n"
     "  --tokens BxS     the layers' batch x sequence sizes (repeatable)\n"
     "  --dtype T        fp16 (default) or bf16\n"
     "  --layout L       bhsd (default) or bshd: the tensors used while\n"
     "                   tuning (a record serves every layout)\n"
     "  --devices LIST   all, or GPU ordinals such as 0,1: one worker per\n"
     "                   GPU takes the next problem until none is left\n"
     "                   (default: GPU 0 only)\n"
     "  --db PATH        the database to tune into (default: user database)\n"
     "  --force          re-tune problems already in the database\n"
     "  --budget S       tuning budget per problem in seconds (0: none)\n"
     "  --json           print the summary as JSON\n"
     "  --dry-run        list the problems (one a line; --json: a JSON\n"
     "                   array of their names) and tune nothing: no GPU\n"
     "                   needed\n"},
    {"pending", cmd_pending, "db force budget json devices", 0, 0,
     "usage: stof-tune pending [--db PATH] [--devices LIST] [--json]\n"
     "\n"
     "Tune the misses that cache-only runs (STOF_TUNE_CACHE_ONLY) recorded\n"
     "in the user database (or --db), and drop each miss once its problem\n"
     "has a record. A mask family's miss (stof_attention_plan_family) is\n"
     "planned again with the sample instance kept with it (lengths,\n"
     "offsets, documents, bitmaps; up to 64 MB). A layer's miss\n"
     "(stof_layer_plan, stof_layer_plan_family) is planned again from its\n"
     "descriptor and mask, or family and sample: its fusion scheme and\n"
     "kernels are tuned. Misses recorded on another GPU, driver or build\n"
     "are skipped and kept. --devices as for tune.\n"},
    {"ls", cmd_ls, "db gpu driver json", 0, 0,
     "usage: stof-tune ls [--db PATH] [--gpu NAME] [--driver N] [--json]\n"
     "\n"
     "List the records of a database: key, GPU, mask, shape, dtype, kernel,\n"
     "time, speed-up over the model's choice, age, hits (the shape of a\n"
     "layer's GEMM is M x N x K, of its norm rows x hidden). Records that\n"
     "fail their checks are marked INVALID (they are never used).\n"},
    {"show", cmd_show, "db json", 1, 1,
     "usage: stof-tune show KEY [--db PATH] [--json]\n"
     "\n"
     "Print one record in full. KEY may be a unique prefix.\n"},
    {"stats", cmd_stats, "db json", 0, 0,
     "usage: stof-tune stats [--db PATH] [--json]\n"
     "\n"
     "What a database holds, by GPU, op, mask, age and version, with hit\n"
     "counts and the recorded misses.\n"},
    {"export", cmd_export, "db out gpu driver json drop-invalid", 0, 0,
     "usage: stof-tune export -o OUT [--db PATH] [--gpu NAME] [--driver N]\n"
     "                        [--drop-invalid] [--json]\n"
     "\n"
     "Write the records of the user database (or --db), optionally only\n"
     "those of one GPU (device name, case-insensitive) and driver version\n"
     "(e.g. 13000), into the database file OUT. Misses are not exported.\n"
     "OUT is checked before any work; an existing OUT is replaced only when\n"
     "it is a stof database that no process has open (else exit 4), and\n"
     "keeps its mode. Every record is checked; one invalid record fails the\n"
     "command unless --drop-invalid leaves it out.\n"},
    {"import", cmd_import, "db gpu driver json drop-invalid", 1, 255,
     "usage: stof-tune import FILE... [--db PATH] [--gpu NAME] [--driver N]\n"
     "                        [--drop-invalid] [--json]\n"
     "\n"
     "Merge database files into the user database (or --db) in place, by\n"
     "the merge rule (see merge); misses are merged too. All or nothing:\n"
     "the files are merged in one transaction, so an unreadable file, an\n"
     "invalid record (without --drop-invalid) or a full disk leaves the\n"
     "database as it was. Imported records are not trusted on this host\n"
     "until their first use verifies them (or `stof-tune verify`).\n"},
    {"merge", cmd_merge, "out gpu driver json drop-invalid", 1, 255,
     "usage: stof-tune merge A B ... -o OUT [--gpu NAME] [--driver N]\n"
     "                        [--drop-invalid] [--json]\n"
     "\n"
     "Merge databases into the file OUT (written as for export). Per key\n"
     "the fastest verified record wins; ties are broken by a total order on\n"
     "the record's content, so merge is commutative and idempotent. Hits\n"
     "take the maximum, misses are merged by key. Every input record that\n"
     "lost to a different record is reported as a conflict; every invalid\n"
     "record is reported and fails the merge unless --drop-invalid.\n"
     "--gpu and --driver keep only the records of that GPU name and\n"
     "driver (misses are merged whole), and an invalid miss row is left\n"
     "out with a note.\n"},
    {"verify", cmd_verify, "db drop json", 0, 0,
     "usage: stof-tune verify [--db PATH] [--drop] [--json]\n"
     "\n"
     "Re-check every record made for this GPU, driver and build. An\n"
     "attention record: load its kernel, run it on random inputs and\n"
     "compare with the C reference. A layer record: plan its layer from\n"
     "the database alone, each of its kernel records (gemm, norm) loaded\n"
     "and checked against the C reference. Records that pass are marked\n"
     "trusted in the user database ($STOF_USER_DB or the default), so\n"
     "programs on this host use them without checking again; bad ones are\n"
     "reported, and deleted with --drop. Records that cannot be rebuilt\n"
     "here (no mask spec, a mask family's, another cuBLASLt's, score\n"
     "modifiers, no memory) are skipped with the reason. A kernel that\n"
     "faults the GPU ends the run's checks: run verify again.\n"},
    {"show-mask", cmd_show_mask, "png tile pixels json", 2, 2,
     "usage: stof-tune show-mask SPEC N|NQxNK [--png FILE] [--tile BMxBN]\n"
     "                          [--pixels PX] [--json]\n"
     "\n"
     "A mask spec at a size as the kernels see it: its density, digest and\n"
     "tiles (--tile, default 128x128; powers of two from 16 to 256) full,\n"
     "partial and empty. --png FILE (a new file, or a PNG it replaces)\n"
     "draws it: keys left to right, queries top to bottom, full tiles\n"
     "blue, partial tiles orange (darker where more elements are allowed),\n"
     "empty tiles white, at most PX pixels a side (--pixels, default\n"
     "1024). Needs no GPU.\n"},
    {"doctor", cmd_doctor, "db json", 0, 0,
     "usage: stof-tune doctor [--db PATH] [--json]\n"
     "\n"
     "What this host gives stof: which libcuda, NVRTC and cuBLASLt were\n"
     "loaded (the file, the variable or default search that chose it, the\n"
     "version, or why one is missing), each GPU as stof sees it, the user\n"
     "database (path, where the path came from, schema, records, misses,\n"
     "trusted records), the tuning mode, the stof variables set, and this\n"
     "build's version and template hash. Exit 0 whatever it finds.\n"},
    {"hf-workload", cmd_hf_workload, "tokens dtype", 1, 1,
     "usage: stof-tune hf-workload CONFIG.json [--tokens BxS]... [--dtype T]\n"
     "\n"
     "Print the workload file (as examples/layers.workload) of a Hugging\n"
     "Face model's decoder layers from its config.json, for `stof-tune\n"
     "tune`: the Llama family (model_type llama, mistral, qwen2, qwen3),\n"
     "whose layers are stof's: its sizes, grouped-query heads, head_dim,\n"
     "biases (Qwen2's), Qwen3's QK norm, RoPE (its base; a scaled rope type\n"
     "such as Llama 3.1's as rope=table), RMSNorm eps and mask (causal, or\n"
     "causal_sliding:W for a sliding window on every layer). The records it\n"
     "tunes are those stof.integrations.hf_layers' plans of the same model\n"
     "look up. --tokens (repeatable; default 1x128 8x512 16x2048) and\n"
     "--dtype (default the config's torch_dtype: bf16 for bfloat16, else\n"
     "fp16) set the sizes. Other models, activations or windows on some\n"
     "layers only fail (exit 1). Needs no GPU.\n"},
    {"gc", cmd_gc, "db dry-run json", 0, 0,
     "usage: stof-tune gc [--db PATH] [--dry-run] [--json]\n"
     "\n"
     "Delete the records made by another stof version or another set of\n"
     "kernel templates (they can never match this build).\n"},
};
#define N_COMMANDS (int)(sizeof(commands) / sizeof(*commands))

static const char exit_text[] =
    "\nexit status: 0 ok; 1 failure (bad input file, a problem or record\n"
    "failed); 2 usage error; 3 no GPU found; 4 database error (missing,\n"
    "unreadable, foreign or newer-schema database, invalid records, an\n"
    "output that cannot be written or replaced, or a failed write).\n";

static void usage_main(FILE *f)
{
    fprintf(f,
            "usage: stof-tune COMMAND [options]   (stof-tune COMMAND --help)\n"
            "\n"
            "Prebuild stof tuning databases and share them across hosts.\n"
            "\n"
            "commands:\n"
            "  tune WORKLOAD    tune a workload file (or --mask/--shape)\n"
            "  pending          tune the misses of cache-only runs\n"
            "  ls               list the records of a database\n"
            "  show KEY         one record in full\n"
            "  stats            counts by GPU, op, mask, age; hits, misses\n"
            "  export -o OUT    copy records (--gpu, --driver) to a new file\n"
            "  import FILE...   merge files into the user database\n"
            "  merge A B... -o OUT  merge files into a new file\n"
            "  verify           re-check this GPU's records\n"
            "  gc               drop records of other stof/template versions\n"
            "  doctor           libraries, GPUs, databases, settings in use\n"
            "  show-mask SPEC N a mask's tiles; --png FILE draws it\n"
            "  hf-workload CONFIG.json  a Hugging Face model's layers as a\n"
            "                   workload\n"
            "\n"
            "common options: --db PATH (default: $STOF_USER_DB, else\n"
            "$XDG_CACHE_HOME/stof/tuning.db, else ~/.cache/stof/tuning.db),\n"
            "--json, -h/--help, --version.\n"
            "%s",
            exit_text);
}

/* Does the space-separated list contain name? */
static int allowed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ' ');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

/* Every option of every command; each command allows a subset. */
static const struct option long_opts[] = {
    {"db", required_argument, NULL, 'd'},
    {"out", required_argument, NULL, 'o'},
    {"output", required_argument, NULL, 'o'},
    {"gpu", required_argument, NULL, 'g'},
    {"driver", required_argument, NULL, 'D'},
    {"mask", required_argument, NULL, 'm'},
    {"shape", required_argument, NULL, 's'},
    {"layer", required_argument, NULL, 'y'},
    {"tokens", required_argument, NULL, 'z'},
    {"dtype", required_argument, NULL, 't'},
    {"layout", required_argument, NULL, 'l'},
    {"budget", required_argument, NULL, 'b'},
    {"devices", required_argument, NULL, 'v'},
    {"json", no_argument, NULL, 'j'},
    {"force", no_argument, NULL, 'f'},
    {"dry-run", no_argument, NULL, 'n'},
    {"drop", no_argument, NULL, 'x'},
    {"drop-invalid", no_argument, NULL, 'X'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {"png", required_argument, NULL, 'P'},
    {"tile", required_argument, NULL, 'T'},
    {"pixels", required_argument, NULL, 'q'},
    {NULL, 0, NULL, 0},
};

/* A number option: finite, in [0, max], an integer when asked. */
static int parse_number(const char *cmd, const char *name, const char *val,
                        double max, int integer, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (!*val || *end || errno || !isfinite(v) || v < 0 || v > max ||
        (integer && v != floor(v))) {
        err("%s: --%s: '%s' is not %s", cmd, name, val,
            integer ? "a driver version such as 13000"
                    : "a number of seconds (0 or more)");
        return 0;
    }
    *out = v;
    return 1;
}

static int add_list(const char *cmd, const char *name, const char **list,
                    int *n, const char *val)
{
    if (*n == OPT_MAX_LIST) {
        err("%s: too many --%s options (%d at most)", cmd, name,
            OPT_MAX_LIST);
        return 0;
    }
    list[(*n)++] = val;
    return 1;
}

/* The name of the long option with code c (for "allowed" checks). */
static const char *option_name(int c)
{
    for (const struct option *p = long_opts; p->name; p++)
        if (p->val == c)
            return p->name;
    return "?";
}

static int parse_opts(const command *c, int argc, char **argv, opts *o)
{
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":o:h", long_opts, NULL)) != -1) {
        if (ch == '?' || ch == ':') {
            const char *a = argv[optind - 1];
            if (ch == ':')
                err("%s: option '%s' needs a value", c->name, a);
            else
                err("%s: unknown option '%s' (see stof-tune %s --help)",
                    c->name, a, c->name);
            return 0;
        }
        if (ch == 'h') {
            o->help = 1;
            continue;
        }
        if (ch == 'V') {
            o->version = 1;
            continue;
        }
        const char *name = option_name(ch);
        if (!allowed(c->allowed, name)) {
            err("%s: unknown option '%s' (see stof-tune %s --help)", c->name,
                argv[optind - 1], c->name);
            return 0;
        }
        double v = 0;
        switch (ch) {
        case 'd': o->db = optarg; break;
        case 'o': o->out = optarg; break;
        case 'g': o->gpu = optarg; break;
        case 't': o->dtype = optarg; break;
        case 'l': o->layout = optarg; break;
        case 'v': o->devices = optarg; break;
        case 'j': o->json = 1; break;
        case 'f': o->force = 1; break;
        case 'n': o->dry_run = 1; break;
        case 'x': o->drop = 1; break;
        case 'X': o->drop_invalid = 1; break;
        case 'P': o->png = optarg; break;
        case 'T': o->tile = optarg; break;
        case 'q': {
            char *end;
            long px = strtol(optarg, &end, 10);
            if (!*optarg || *end || px < 16 || px > 8192) {
                err("%s: --pixels: '%s' is not a number of pixels (16 to "
                    "8192)",
                    c->name, optarg);
                return 0;
            }
            o->pixels = (int)px;
            break;
        }
        case 'm':
            if (!add_list(c->name, name, o->masks, &o->n_masks, optarg))
                return 0;
            break;
        case 's':
            if (!add_list(c->name, name, o->shapes, &o->n_shapes, optarg))
                return 0;
            break;
        case 'y':
            if (!add_list(c->name, name, o->layers, &o->n_layers, optarg))
                return 0;
            break;
        case 'z':
            if (!add_list(c->name, name, o->tokens, &o->n_tokens, optarg))
                return 0;
            break;
        case 'D':
            if (!parse_number(c->name, name, optarg, 1e9, 1, &v))
                return 0;
            o->driver = (int)v;
            break;
        case 'b':
            if (!parse_number(c->name, name, optarg, 1e9, 0, &v))
                return 0;
            o->budget = v;
            break;
        }
    }
    for (int i = optind; i < argc; i++) {
        if (o->n_pos == 255) {
            err("%s: too many arguments", c->name);
            return 0;
        }
        o->pos[o->n_pos++] = argv[i];
    }
    if (o->help || o->version)
        return 1;
    if (o->n_pos < c->min_pos || o->n_pos > c->max_pos) {
        err("%s: expected %s%d argument%s, got %d (see stof-tune %s --help)",
            c->name, c->min_pos == c->max_pos ? "" : "at least ", c->min_pos,
            c->min_pos == 1 ? "" : "s", o->n_pos, c->name);
        return 0;
    }
    return 1;
}

/* The exit code once stdout is flushed: a write that failed (a full disk,
 * a closed pipe) is an error even for --help. */
static int finish(int rc)
{
    fflush(stdout);
    if (ferror(stdout)) {
        err("cannot write the output: %s", strerror(errno));
        rc = rc ? rc : EXIT_FAIL;
    }
    return rc;
}

/* A failed command's JSON error document, when --json was asked and the
 * command printed none (its arguments may not even have parsed). */
static void json_error(int rc)
{
    if (rc != EXIT_OK && !g_json_printed)
        (void)print_json(json_pack("{s:s, s:i}", "error",
                                   g_first_err[0] ? g_first_err : "failed",
                                   "exit", rc));
}

static int wants_json(int argc, char **argv)
{
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--"))
            break;
        if (!strcmp(argv[i], "--json"))
            return 1;
    }
    return 0;
}

static int run(int argc, char **argv)
{
    if (argc < 2) {
        usage_main(stderr);
        return EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "-h") || !strcmp(name, "--help") ||
        !strcmp(name, "help")) {
        if (argc > 2 && strcmp(name, "help") == 0) {
            for (int i = 0; i < N_COMMANDS; i++)
                if (!strcmp(argv[2], commands[i].name)) {
                    printf("%s%s", commands[i].usage, exit_text);
                    return EXIT_OK;
                }
        }
        usage_main(stdout);
        return EXIT_OK;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "-V")) {
        printf("stof-tune %s (database schema %d)\n", stof_version_string(),
               STOF_DB_SCHEMA_VERSION);
        return EXIT_OK;
    }
    const command *c = NULL;
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, commands[i].name))
            c = &commands[i];
    if (!c) {
        err("unknown command '%s' (see stof-tune --help)", name);
        return EXIT_USAGE;
    }
    static opts o;
    o.cmd = c->name;
    if (!parse_opts(c, argc - 1, argv + 1, &o)) {
        if (wants_json(argc, argv))
            json_error(EXIT_USAGE);
        return EXIT_USAGE;
    }
    if (o.help) {
        printf("%s%s", c->usage, exit_text);
        return EXIT_OK;
    }
    if (o.version) {
        printf("stof-tune %s (database schema %d)\n", stof_version_string(),
               STOF_DB_SCHEMA_VERSION);
        return EXIT_OK;
    }
    install_signals();
    stof_context *ctx = open_cpu_ctx();
    if (!ctx) {
        err("out of memory");
        if (o.json)
            json_error(EXIT_FAIL);
        return EXIT_FAIL;
    }
    int rc = c->fn(ctx, &o);
    if (o.json)
        json_error(rc);
    stof_close(&ctx);
    return rc;
}

int main(int argc, char **argv)
{
    return finish(run(argc, argv));
}
