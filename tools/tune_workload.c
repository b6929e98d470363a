/*
 * tune_workload.c - parse the workload files of `stof-tune tune` (format in
 * tune_workload.h and examples/suite.workload).
 */
#include "tune_workload.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"
#include "layer_int.h"

void tw_init(tw_workload *w)
{
    memset(w, 0, sizeof(*w));
}

void tw_free(tw_workload *w)
{
    for (int i = 0; i < w->n_masks; i++)
        free(w->masks[i]);
    memset(w, 0, sizeof(*w));
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* "where: " for messages: FILE:LINE or the command line. */
static void where(const tw_workload *w, int line, char *buf, size_t n)
{
    if (line > 0)
        snprintf(buf, n, "%s:%d", w->source, line);
    else
        snprintf(buf, n, "%s", w->source);
}

static int add_mask(tw_workload *w, const char *spec, int line, char *msg,
                    size_t n)
{
    char at[600];
    where(w, line, at, sizeof(at));
    if (!*spec) {
        snprintf(msg, n, "%s: 'mask' needs a spec, e.g. mask sliding:256", at);
        return 1;
    }
    for (int i = 0; i < w->n_masks; i++)
        if (!strcmp(w->masks[i], spec))
            return 0; /* given before: one problem, not two */
    if (w->n_masks == TW_MAX) {
        snprintf(msg, n, "%s: more than %d masks", at, TW_MAX);
        return 1;
    }
    if (!(w->masks[w->n_masks] = strdup(spec))) {
        snprintf(msg, n, "%s: out of memory", at);
        return 1;
    }
    w->mask_line[w->n_masks++] = line;
    return 0;
}

/* BxHxNxD, BxHxSQxSKxD, or the same separated by spaces. */
static int add_shape(tw_workload *w, const char *text, int line, char *msg,
                     size_t n)
{
    char at[600];
    where(w, line, at, sizeof(at));
    long v[6];
    int k = 0;
    const char *p = text;
    while (*p) {
        while (isspace((unsigned char)*p) || *p == 'x' || *p == 'X')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || k == 6) {
            k = -1;
            break;
        }
        v[k++] = x;
        p = end;
        if (*p && !isspace((unsigned char)*p) && *p != 'x' && *p != 'X') {
            k = -1;
            break;
        }
    }
    if (k != 4 && k != 5) {
        snprintf(msg, n,
                 "%s: bad shape '%s': expected BxHxNxD or BxHxSQxSKxD "
                 "(e.g. 4x16x4096x64)",
                 at, text);
        return 1;
    }
    int s[5] = {(int)v[0], (int)v[1], (int)v[2], (int)v[k == 4 ? 2 : 3],
                (int)v[k - 1]};
    for (int i = 0; i < k; i++)
        if (v[i] < 1 || v[i] > (1 << 20)) {
            snprintf(msg, n, "%s: bad shape '%s': %ld is out of range 1..%d",
                     at, text, v[i], 1 << 20);
            return 1;
        }
    if (s[4] < 16 || s[4] > 256 || s[4] % 8) {
        snprintf(msg, n,
                 "%s: bad shape '%s': head_dim %d must be 16..256 and a "
                 "multiple of 8",
                 at, text, s[4]);
        return 1;
    }
    for (int i = 0; i < w->n_shapes; i++)
        if (!memcmp(w->shapes[i], s, sizeof(s)))
            return 0; /* given before (perhaps written otherwise) */
    if (w->n_shapes == TW_MAX) {
        snprintf(msg, n, "%s: more than %d shapes", at, TW_MAX);
        return 1;
    }
    memcpy(w->shapes[w->n_shapes++], s, sizeof(s));
    return 0;
}

/* A list of words into dtypes or layouts (no duplicates). */
static int add_words(tw_workload *w, int is_dtype, char *words, int line,
                     char *msg, size_t n)
{
    char at[600];
    where(w, line, at, sizeof(at));
    int any = 0;
    for (char *t = strtok(words, " \t,"); t; t = strtok(NULL, " \t,")) {
        int val;
        if (is_dtype) {
            if (!strcasecmp(t, "fp16"))
                val = STOF_DTYPE_FP16;
            else if (!strcasecmp(t, "bf16"))
                val = STOF_DTYPE_BF16;
            else {
                snprintf(msg, n, "%s: unknown dtype '%s' (fp16 or bf16)", at,
                         t);
                return 1;
            }
        } else {
            if (!strcasecmp(t, "bhsd"))
                val = STOF_LAYOUT_BHSD;
            else if (!strcasecmp(t, "bshd"))
                val = STOF_LAYOUT_BSHD;
            else {
                snprintf(msg, n, "%s: unknown layout '%s' (bhsd or bshd)", at,
                         t);
                return 1;
            }
        }
        any = 1;
        int dup = 0;
        int cnt = is_dtype ? w->n_dtypes : w->n_layouts;
        for (int i = 0; i < cnt; i++)
            dup |= (is_dtype ? (int)w->dtypes[i] : (int)w->layouts[i]) == val;
        if (dup)
            continue;
        if (is_dtype)
            w->dtypes[w->n_dtypes++] = (stof_dtype)val;
        else
            w->layouts[w->n_layouts++] = (stof_layout)val;
    }
    if (!any) {
        snprintf(msg, n, "%s: '%s' needs a value", at,
                 is_dtype ? "dtype" : "layout");
        return 1;
    }
    return 0;
}

/* An integer in [lo, hi] from the whole of text. */
static int int_in(const char *text, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    const long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < lo || v > hi)
        return 0;
    *out = (int)v;
    return 1;
}

/* A positive integer of at most 2^20 (a size). */
static int small_int(const char *text, int *out)
{
    return int_in(text, 1, 1 << 20, out);
}

/* tokens BxS [BxS ...]: the layers' sizes. */
static int add_tokens(tw_workload *w, char *text, int line, char *msg,
                      size_t n)
{
    char at[600];
    where(w, line, at, sizeof(at));
    int any = 0;
    for (char *t = strtok(text, " \t,"); t; t = strtok(NULL, " \t,")) {
        char *x = strpbrk(t, "xX");
        int b = 0, sq = 0;
        if (x)
            *x = '\0';
        if (!x || !small_int(t, &b) || !small_int(x + 1, &sq)) {
            if (x)
                *x = 'x';
            snprintf(msg, n,
                     "%s: bad tokens '%s': expected BATCHxSEQ, each 1..%d "
                     "(e.g. tokens 8x512)",
                     at, t, 1 << 20);
            return 1;
        }
        int dup = 0;
        for (int i = 0; i < w->n_tokens; i++)
            dup |= w->tokens[i][0] == b && w->tokens[i][1] == sq;
        if (dup) {
            any = 1;
            continue;
        }
        if (w->n_tokens == TW_MAX) {
            snprintf(msg, n, "%s: more than %d tokens sizes", at, TW_MAX);
            return 1;
        }
        w->tokens[w->n_tokens][0] = b;
        w->tokens[w->n_tokens++][1] = sq;
        any = 1;
    }
    if (!any) {
        snprintf(msg, n, "%s: 'tokens' needs a size, e.g. tokens 8x512", at);
        return 1;
    }
    return 0;
}

static const char *const act_names[] = {"none", "gelu_tanh", "gelu_erf",
                                        "relu", "silu"};

/* layer NAME key=value ... (tune_workload.h). */
static int add_layer(tw_workload *w, char *text, int line, char *msg,
                     size_t n)
{
    char at[600];
    where(w, line, at, sizeof(at));
    char *name = strtok(text, " \t");
    if (!name || strchr(name, '=')) {
        snprintf(msg, n,
                 "%s: 'layer' needs a name, then its sizes, e.g. layer "
                 "bert-base hidden=768 heads=12 ffn=3072 act=gelu_erf",
                 at);
        return 1;
    }
    if (strlen(name) >= sizeof(w->layers[0].name)) {
        snprintf(msg, n, "%s: layer name '%.40s...' is too long", at, name);
        return 1;
    }
    if (w->n_layers == TW_MAX_LAYERS) {
        snprintf(msg, n, "%s: more than %d layers", at, TW_MAX_LAYERS);
        return 1;
    }
    tw_layer *L = &w->layers[w->n_layers];
    memset(L, 0, sizeof(*L));
    snprintf(L->name, sizeof(L->name), "%s", name);
    L->line = line;
    stof_layer_desc_init(&L->d, 1, 1, 0, 0, STOF_DTYPE_FP16);
    L->d.ffn = 0;
    for (char *t = strtok(NULL, " \t"); t; t = strtok(NULL, " \t")) {
        char *eq = strchr(t, '=');
        const char *v = eq ? eq + 1 : "";
        if (eq)
            *eq = '\0';
        int ok = 1;
        if (!strcmp(t, "hidden"))
            ok = eq && small_int(v, &L->d.hidden);
        else if (!strcmp(t, "heads"))
            ok = eq && small_int(v, &L->d.heads);
        else if (!strcmp(t, "ffn"))
            ok = eq && small_int(v, &L->d.ffn);
        else if (!strcmp(t, "kv_heads"))
            ok = eq && small_int(v, &L->d.kv_heads);
        else if (!strcmp(t, "eps")) {
            char *end;
            errno = 0;
            const double e = eq ? strtod(v, &end) : 0.0;
            ok = eq && end != v && !*end && !errno && e > 0.0 && e < 1.0;
            L->d.norm_eps = (float)e;
        } else if (!strcmp(t, "act")) {
            ok = 0;
            for (int a = 0; eq && a < 5; a++)
                if (!strcmp(v, act_names[a])) {
                    L->d.act = (stof_activation)a;
                    ok = 1;
                }
        } else if (!strcmp(t, "norm")) {
            ok = eq && (!strcmp(v, "layer") || !strcmp(v, "rms"));
            L->d.norm = ok && !strcmp(v, "rms") ? STOF_NORM_RMS
                                                : STOF_NORM_LAYER;
        } else if (!strcmp(t, "pre") || !strcmp(t, "post")) {
            ok = !eq;
            L->d.pre_norm = !strcmp(t, "pre");
        } else if (!strcmp(t, "gated"))
            L->d.gated = ok = !eq;
        else if (!strcmp(t, "no_bias"))
            L->d.no_bias = ok = !eq;
        else if (!strcmp(t, "qk_norm"))
            L->d.qk_norm = ok = !eq;
        else if (!strcmp(t, "head_dim"))
            /* (0: hidden / heads; the range is the plan's rule) */
            ok = eq && int_in(v, 0, 1 << 20, &L->d.head_dim);
        else if (!strcmp(t, "rope") && eq && !strcmp(v, "table")) {
            /* a layer with frequencies of its own (the key's "table"; the
             * scheme does not depend on them: stand-ins) */
            L->d.rope_theta = 0.0f;
            L->d.rope_freq = stof__rope_freq_standin();
        } else if (!strcmp(t, "rope")) {
            /* (a base a float holds, above 1 once rounded to it) */
            char *end;
            errno = 0;
            const double th = eq ? strtod(v, &end) : 0.0;
            ok = eq && end != v && !*end && !errno && th > 1.0 &&
                 th <= FLT_MAX && (float)th > 1.0f;
            L->d.rope_theta = ok ? (float)th : 0.0f;
            L->d.rope_freq = NULL;
        } else if (!strcmp(t, "rope_dim")) {
            /* (0: the whole head; the head's size and the multiple of 4
             * are checked with the plan's rules, tw_check_specs) */
            ok = eq && int_in(v, 0, 1 << 20, &L->d.rope_dim);
        } else {
            snprintf(msg, n,
                     "%s: layer %s: unknown setting '%.40s' (hidden, heads, "
                     "ffn, kv_heads, act, norm, pre, post, gated, no_bias, "
                     "qk_norm, head_dim, eps, rope, rope_dim)",
                     at, L->name, t);
            return 1;
        }
        if (!ok) {
            snprintf(msg, n,
                     "%s: layer %s: bad %s%s%.40s (sizes 1..%d; act none, "
                     "gelu_tanh, gelu_erf, relu or silu; norm layer or rms; "
                     "eps in (0, 1); rope a finite base > 1, e.g. 10000, or "
                     "table; "
                     "rope_dim 0 (the whole head) or a multiple of 4; pre, "
                     "post, gated, no_bias, qk_norm take no value)",
                     at, L->name, t, eq ? "=" : "", v, 1 << 20);
            return 1;
        }
    }
    if (!L->d.hidden || !L->d.heads) {
        snprintf(msg, n, "%s: layer %s needs hidden= and heads=", at,
                 L->name);
        return 1;
    }
    if (!L->d.ffn)
        L->d.ffn = 4 * L->d.hidden;
    if ((!L->d.head_dim && L->d.hidden % L->d.heads) ||
        (L->d.kv_heads && L->d.heads % L->d.kv_heads)) {
        snprintf(msg, n,
                 "%s: layer %s: heads %d must divide hidden %d (or give "
                 "head_dim), and kv_heads %d divide heads",
                 at, L->name, L->d.heads, L->d.hidden, L->d.kv_heads);
        return 1;
    }
    for (int i = 0; i < w->n_layers; i++)
        if (!strcmp(w->layers[i].name, L->name)) {
            snprintf(msg, n,
                     "%s: layer %s is given twice (a name is its problems' "
                     "name: give each layer its own)",
                     at, L->name);
            return 1;
        }
    w->n_layers++;
    return 0;
}

static int finish(tw_workload *w, char *msg, size_t n)
{
    const int cl = !strcmp(w->source, "command line");
    if (w->n_layers && !w->n_tokens) {
        snprintf(msg, n, "%s: layers but no %s (their batch x sequence "
                 "sizes, e.g. %s 8x512)",
                 w->source, cl ? "--tokens" : "'tokens' line",
                 cl ? "--tokens" : "tokens");
        return 1;
    }
    if (w->n_tokens && !w->n_layers) {
        snprintf(msg, n, "%s: %s but no %s", w->source,
                 cl ? "--tokens" : "'tokens'", cl ? "--layer" : "'layer' line");
        return 1;
    }
    if (!w->n_masks || (!w->n_shapes && !w->n_layers)) {
        snprintf(msg, n, "%s: no %s given (a workload needs at least one "
                 "'mask' and one 'shape' line, or 'layer' and 'tokens')",
                 w->source, !w->n_masks ? "mask" : "shape");
        return 1;
    }
    if (!w->n_dtypes)
        w->dtypes[w->n_dtypes++] = STOF_DTYPE_FP16;
    if (!w->n_layouts)
        w->layouts[w->n_layouts++] = STOF_LAYOUT_BHSD;
    const long long problems =
        (long long)w->n_masks * w->n_dtypes *
        ((long long)w->n_shapes * w->n_layouts +
         (long long)w->n_layers * w->n_tokens);
    if (problems > TW_MAX_PROBLEMS) {
        snprintf(msg, n, "%s: %lld problems, more than the %d one run tunes",
                 w->source, problems, TW_MAX_PROBLEMS);
        return 1;
    }
    return 0;
}

/* The largest workload file read: far beyond any real one, and it keeps a
 * file that never ends (a device, a FIFO fed forever) from being read
 * for ever. */
#define TW_MAX_BYTES (4u << 20)

/* Read the whole file at path into a NUL-terminated buffer (caller frees).
 * A NUL byte means it is not a text file: reading stops there, so even
 * /dev/zero is refused at once. 0, or nonzero with the message. */
static int read_text(const char *path, char **out, char *msg, size_t n)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(msg, n, "%s: %s", path, strerror(errno));
        return 1;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    int bad = !buf;
    if (bad)
        snprintf(msg, n, "%s: out of memory", path);
    while (!bad) {
        if (len == cap) {
            if (cap >= TW_MAX_BYTES) {
                snprintf(msg, n,
                         "%s: larger than %u MiB: not a workload file", path,
                         TW_MAX_BYTES >> 20);
                bad = 1;
                break;
            }
            char *b = realloc(buf, 2 * cap + 1);
            if (!b) {
                snprintf(msg, n, "%s: out of memory", path);
                bad = 1;
                break;
            }
            buf = b;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        const char *nul = memchr(buf + len, '\0', got);
        if (nul) {
            int line = 1;
            for (const char *p = buf; p < nul; p++)
                line += *p == '\n';
            snprintf(msg, n, "%s:%d: not a text file (a NUL byte at offset "
                     "%zu)", path, line, (size_t)(nul - buf));
            bad = 1;
            break;
        }
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                snprintf(msg, n, "%s: read error: %s", path, strerror(errno));
                bad = 1;
            }
            break;
        }
    }
    fclose(f);
    if (bad) {
        free(buf);
        return 1;
    }
    buf[len] = '\0';
    *out = buf;
    return 0;
}

int tw_parse_file(const char *path, tw_workload *w, char *msg, size_t n)
{
    tw_init(w);
    snprintf(w->source, sizeof(w->source), "%s", path);
    char *text = NULL;
    if (read_text(path, &text, msg, n))
        return 1;
    int ln = 0, bad = 0;
    for (char *line = text; !bad && line && *line;) {
        char *next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        ln++;
        if (strlen(line) > 4000) {
            snprintf(msg, n, "%s:%d: line too long", path, ln);
            bad = 1;
            break;
        }
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *s = trim(line);
        line = next;
        if (!*s)
            continue;
        char *arg = s;
        while (*arg && !isspace((unsigned char)*arg))
            arg++;
        if (*arg)
            *arg++ = '\0';
        arg = trim(arg);
        if (!strcmp(s, "mask"))
            bad = add_mask(w, arg, ln, msg, n);
        else if (!strcmp(s, "shape"))
            bad = add_shape(w, arg, ln, msg, n);
        else if (!strcmp(s, "dtype"))
            bad = add_words(w, 1, arg, ln, msg, n);
        else if (!strcmp(s, "layout"))
            bad = add_words(w, 0, arg, ln, msg, n);
        else if (!strcmp(s, "layer"))
            bad = add_layer(w, arg, ln, msg, n);
        else if (!strcmp(s, "tokens"))
            bad = add_tokens(w, arg, ln, msg, n);
        else {
            snprintf(msg, n,
                     "%s:%d: unknown directive '%.40s' (expected mask, shape, "
                     "dtype, layout, layer or tokens)",
                     path, ln, s);
            bad = 1;
        }
    }
    free(text);
    if (!bad)
        bad = finish(w, msg, n);
    if (bad)
        tw_free(w);
    return bad;
}

int tw_from_args(const char *const *masks, int n_masks,
                 const char *const *shapes, int n_shapes,
                 const char *const *layers, int n_layers,
                 const char *const *tokens, int n_tokens, const char *dtype,
                 const char *layout, tw_workload *w, char *msg, size_t n)
{
    tw_init(w);
    snprintf(w->source, sizeof(w->source), "command line");
    int bad = 0;
    for (int i = 0; !bad && i < n_masks; i++)
        bad = add_mask(w, masks[i], 0, msg, n);
    for (int i = 0; !bad && i < n_shapes; i++)
        bad = add_shape(w, shapes[i], 0, msg, n);
    char line[4096]; /* the directives' parsers cut their text */
    for (int i = 0; !bad && i < n_layers; i++) {
        snprintf(line, sizeof(line), "%s", layers[i]);
        bad = add_layer(w, line, 0, msg, n);
    }
    for (int i = 0; !bad && i < n_tokens; i++) {
        snprintf(line, sizeof(line), "%s", tokens[i]);
        bad = add_tokens(w, line, 0, msg, n);
    }
    char buf[256];
    if (!bad && dtype) {
        snprintf(buf, sizeof(buf), "%s", dtype);
        bad = add_words(w, 1, buf, 0, msg, n);
    }
    if (!bad && layout) {
        snprintf(buf, sizeof(buf), "%s", layout);
        bad = add_words(w, 0, buf, 0, msg, n);
    }
    if (!bad)
        bad = finish(w, msg, n);
    if (bad)
        tw_free(w);
    return bad;
}

int tw_check_specs(stof_context *ctx, const tw_workload *w, char *msg,
                   size_t n)
{
    /* A spec's validity does not depend on the sizes (1..2^20, which the
     * shapes are checked against): a small mask shows every error at once
     * and costs nothing, whatever the shapes. */
    for (int i = 0; i < w->n_masks; i++) {
        stof_mask *m = NULL;
        if (stof_mask_from_spec(ctx, w->masks[i], 64, 64, &m) != STOF_OK) {
            char at[600];
            where(w, w->mask_line[i], at, sizeof(at));
            snprintf(msg, n, "%s: bad mask '%s': %s", at, w->masks[i],
                     stof_errmsg(ctx));
            return 1;
        }
        stof_mask_free(&m);
    }
    /* Shapes and layers as a plan checks them (no GPU, no mask built: a
     * problem a plan would refuse is named before any tuning starts). */
    for (int i = 0; i < w->n_shapes; i++) {
        const int *s = w->shapes[i];
        if (stof__attention_shape_check(ctx, s[0], s[1], 0, s[2], s[3], s[4],
                                        STOF_DTYPE_FP16) != STOF_OK) {
            snprintf(msg, n, "%s: bad shape %dx%dx%dx%dx%d: %s", w->source,
                     s[0], s[1], s[2], s[3], s[4], stof_errmsg(ctx));
            return 1;
        }
    }
    for (int i = 0; i < w->n_layers; i++)
        for (int t = 0; t < w->n_tokens; t++) {
            const tw_layer *L = &w->layers[i];
            stof_layer_desc d = L->d;
            d.batch = w->tokens[t][0];
            d.seq = w->tokens[t][1];
            if (stof__layer_desc_check(ctx, &d) != STOF_OK) {
                char at[600];
                where(w, L->line, at, sizeof(at));
                snprintf(msg, n, "%s: layer %s at %dx%d tokens: %s", at,
                         L->name, d.batch, d.seq, stof_errmsg(ctx));
                return 1;
            }
        }
    return 0;
}

/* Attention problems come first, then the layers'. */
static int attn_count(const tw_workload *w)
{
    return w->n_masks * w->n_shapes * w->n_dtypes * w->n_layouts;
}

int tw_count(const tw_workload *w)
{
    return attn_count(w) +
           w->n_layers * w->n_tokens * w->n_masks * w->n_dtypes;
}

void tw_get(const tw_workload *w, int i, tw_problem *p)
{
    memset(p, 0, sizeof(*p));
    if (i >= attn_count(w)) {
        i -= attn_count(w);
        const int d = i % w->n_dtypes;
        i /= w->n_dtypes;
        const int m = i % w->n_masks;
        i /= w->n_masks;
        const int t = i % w->n_tokens;
        p->layer = &w->layers[i / w->n_tokens];
        p->mask = w->masks[m];
        p->batch = w->tokens[t][0];
        p->seq_q = p->seq_k = w->tokens[t][1];
        p->dtype = w->dtypes[d];
        p->layout = STOF_LAYOUT_BHSD;
        return;
    }
    int l = i % w->n_layouts;
    i /= w->n_layouts;
    int d = i % w->n_dtypes;
    i /= w->n_dtypes;
    int s = i % w->n_shapes;
    int m = i / w->n_shapes;
    p->mask = w->masks[m];
    p->batch = w->shapes[s][0];
    p->heads = w->shapes[s][1];
    p->seq_q = w->shapes[s][2];
    p->seq_k = w->shapes[s][3];
    p->head_dim = w->shapes[s][4];
    p->dtype = w->dtypes[d];
    p->layout = w->layouts[l];
}

void tw_layer_desc(const tw_problem *p, stof_layer_desc *d)
{
    *d = p->layer->d;
    d->batch = p->batch;
    d->seq = p->seq_q;
    d->dtype = p->dtype;
}

void tw_describe(const tw_problem *p, char *buf, size_t n)
{
    if (p->layer) {
        snprintf(buf, n, "layer %s %s %dx%d %s", p->layer->name, p->mask,
                 p->batch, p->seq_q,
                 p->dtype == STOF_DTYPE_BF16 ? "bf16" : "fp16");
        return;
    }
    snprintf(buf, n, "%s %dx%dx%dx%dx%d %s %s", p->mask, p->batch, p->heads,
             p->seq_q, p->seq_k, p->head_dim,
             p->dtype == STOF_DTYPE_BF16 ? "bf16" : "fp16",
             p->layout == STOF_LAYOUT_BSHD ? "bshd" : "bhsd");
}
