/*
 * tune_hf.c - `stof-tune hf-workload`: the workload of a Hugging Face
 * model's decoder layers from its config.json (the Llama family: model
 * types llama, mistral, qwen2, qwen3), so that a fleet prebuilds the
 * records that python/stof/integrations/hf_layers.py's plans of the same
 * model look up. The rules are hf_layers'; the two must say the same:
 *   - SwiGLU (hidden_act silu or swish), pre-norm RMSNorm with
 *     rms_norm_eps, grouped-query heads (num_key_value_heads);
 *   - head_dim where heads * head_dim is not hidden_size;
 *   - biases: Qwen2 always (Q, K, V), Mistral never, Llama and Qwen3 as
 *     attention_bias (and Llama's mlp_bias) say;
 *   - Qwen3's QK norm;
 *   - RoPE: the default rope type by its base (rope_theta; whole heads:
 *     a partial_rotary_factor is ignored, as those models ignore it), a
 *     scaled type (llama3, yarn, longrope, dynamic, linear) as rope=table
 *     (a table of the model's own frequencies: one record serves any);
 *   - the mask: causal, or causal_sliding:W where a sliding window applies
 *     to every layer (Mistral's; Qwen2's and Qwen3's by layer_types, or
 *     use_sliding_window and max_window_layers), never for Llama.
 * Both transformers 5's config.json (rope_parameters) and the older form
 * (rope_theta, rope_scaling) are read.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tune_cli.h"

/* The config's integer member name (> 0), or 0 with a message. */
static int get_pos_int(const json_t *c, const char *name, int *out,
                       char *msg, size_t n)
{
    const json_t *v = json_object_get(c, name);
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > (1 << 24)) {
        snprintf(msg, n, "%s is %s", name,
                 v ? "not a positive integer" : "missing");
        return 0;
    }
    *out = (int)json_integer_value(v);
    return 1;
}

static int get_bool(const json_t *c, const char *name)
{
    return json_is_true(json_object_get(c, name));
}

/* The rope settings: *theta (the base), *scaled (a rope type other than
 * the default). */
static int rope_of(const json_t *c, double *theta, int *scaled, char *msg,
                   size_t n)
{
    const json_t *p = json_object_get(c, "rope_parameters");
    const json_t *s = json_object_get(c, "rope_scaling");
    const json_t *t = json_object_get(p, "rope_theta");
    if (!t)
        t = json_object_get(c, "rope_theta");
    *theta = t ? json_number_value(t) : 10000.0;
    if ((t && !json_is_number(t)) || !(*theta > 1.0) || !isfinite(*theta)) {
        snprintf(msg, n, "rope_theta is not a base > 1");
        return 0;
    }
    if (json_is_object(p) && !json_object_get(p, "rope_type") &&
        !json_object_get(p, "type") && !json_object_get(p, "rope_theta")) {
        snprintf(msg, n, "rope_parameters per layer type are not read");
        return 0;
    }
    const json_t *src = json_is_object(p) ? p : s;
    const json_t *ty = json_object_get(src, "rope_type");
    if (!ty)
        ty = json_object_get(src, "type");
    const char *type = json_is_string(ty) ? json_string_value(ty) : "default";
    *scaled = strcmp(type, "default") != 0;
    const json_t *pr = json_object_get(src, "partial_rotary_factor");
    if (!pr)
        pr = json_object_get(c, "partial_rotary_factor");
    if (*scaled && json_is_number(pr) && json_number_value(pr) != 1.0) {
        snprintf(msg, n, "a partial_rotary_factor with rope type %s (these "
                         "models rotate whole heads)", type);
        return 0;
    }
    return 1;
}

/* The mask spec into spec, as transformers' configurations decide it:
 * sliding_window defaults to 4096 (null: none); Qwen2's and Qwen3's
 * window applies only with use_sliding_window, to the layers layer_types
 * names, else to those from max_window_layers (default 28) on. */
static int mask_of(const json_t *c, const char *mt, char *spec, size_t ns,
                   char *msg, size_t n)
{
    const json_t *w = json_object_get(c, "sliding_window");
    snprintf(spec, ns, "causal");
    if (!strcmp(mt, "llama") || json_is_null(w))
        return 1;
    if (w && (!json_is_integer(w) || json_integer_value(w) < 1 ||
              json_integer_value(w) > (1 << 30))) {
        snprintf(msg, n, "sliding_window is not a positive integer or null");
        return 0;
    }
    const long long win = w ? (long long)json_integer_value(w) : 4096;
    if (!strcmp(mt, "mistral")) {
        snprintf(spec, ns, "causal_sliding:%lld", win);
        return 1;
    }
    if (!get_bool(c, "use_sliding_window"))
        return 1;
    const json_t *types = json_object_get(c, "layer_types");
    int full = 0, sliding = 0;
    if (json_is_array(types)) {
        size_t i;
        const json_t *e;
        json_array_foreach(types, i, e) {
            const char *s = json_is_string(e) ? json_string_value(e) : "";
            full += !strcmp(s, "full_attention");
            sliding += !strcmp(s, "sliding_attention");
        }
        if (full + sliding != (int)json_array_size(types)) {
            snprintf(msg, n, "layer_types holds a kind of attention other "
                             "than full_attention and sliding_attention");
            return 0;
        }
    } else {
        int layers = 0;
        if (!get_pos_int(c, "num_hidden_layers", &layers, msg, n))
            return 0;
        const json_t *m = json_object_get(c, "max_window_layers");
        const long long first = json_is_integer(m) ? json_integer_value(m)
                                                   : 28;
        full = first < layers ? (first > 0 ? (int)first : 0) : layers;
        sliding = layers - full;
    }
    if (sliding && full) {
        snprintf(msg, n, "a sliding window on some layers only (%d of %d)",
                 sliding, sliding + full);
        return 0;
    }
    if (sliding)
        snprintf(spec, ns, "causal_sliding:%lld", win);
    return 1;
}

/* The workload text of config c (its file name `path` for the comment)
 * into out; 0 with a message when the model cannot be mapped. */
static int workload_of(const json_t *c, const char *path, const opts *o,
                       FILE *out, char *msg, size_t n)
{
    const json_t *jt = json_object_get(c, "model_type");
    const char *mt = json_is_string(jt) ? json_string_value(jt) : "";
    if (strcmp(mt, "llama") && strcmp(mt, "mistral") && strcmp(mt, "qwen2") &&
        strcmp(mt, "qwen3")) {
        snprintf(msg, n, "model_type '%.40s' is not llama, mistral, qwen2 or "
                         "qwen3 (their decoder layers are what stof's "
                         "layer computes)", mt);
        return 0;
    }
    const json_t *ja = json_object_get(c, "hidden_act");
    const char *act = json_is_string(ja) ? json_string_value(ja) : "silu";
    if (strcmp(act, "silu") && strcmp(act, "swish")) {
        snprintf(msg, n, "hidden_act '%.40s' (stof's gated FFN here is "
                         "SwiGLU: silu)", act);
        return 0;
    }
    int hidden = 0, heads = 0, ffn = 0, kvh = 0, hd = 0;
    if (!get_pos_int(c, "hidden_size", &hidden, msg, n) ||
        !get_pos_int(c, "num_attention_heads", &heads, msg, n) ||
        !get_pos_int(c, "intermediate_size", &ffn, msg, n))
        return 0;
    /* (Llama's default: heads; the others' defaults differ by model:
     * their configs state it) */
    if (strcmp(mt, "llama") ||
        (json_object_get(c, "num_key_value_heads") &&
         !json_is_null(json_object_get(c, "num_key_value_heads")))) {
        if (!get_pos_int(c, "num_key_value_heads", &kvh, msg, n))
            return 0;
    }
    const json_t *jh = json_object_get(c, "head_dim");
    if (jh && !json_is_null(jh) && !get_pos_int(c, "head_dim", &hd, msg, n))
        return 0;
    if (!hd)
        hd = hidden / heads;
    const json_t *je = json_object_get(c, "rms_norm_eps");
    const double eps = json_is_number(je) ? json_number_value(je) : 0.0;
    if (!(eps > 0.0 && eps < 1.0)) {
        snprintf(msg, n, "rms_norm_eps is %s",
                 je ? "not in (0, 1)" : "missing");
        return 0;
    }
    double theta = 0.0;
    int scaled = 0;
    char spec[64];
    if (!rope_of(c, &theta, &scaled, msg, n) ||
        !mask_of(c, mt, spec, sizeof(spec), msg, n))
        return 0;
    const int bias = !strcmp(mt, "qwen2")     ? 1
                     : !strcmp(mt, "mistral") ? 0
                     : get_bool(c, "attention_bias") ||
                         (!strcmp(mt, "llama") && get_bool(c, "mlp_bias"));
    /* dtype: --dtype, else the config's (torch_dtype, or transformers 5's
     * dtype) when it is bfloat16 */
    const json_t *jd = json_object_get(c, "torch_dtype");
    if (!jd)
        jd = json_object_get(c, "dtype");
    const char *dt = o->dtype ? o->dtype
                     : json_is_string(jd) &&
                             !strcmp(json_string_value(jd), "bfloat16")
                         ? "bf16"
                         : "fp16";
    fprintf(out,
            "# %s's decoder layers (stof-tune hf-workload %s): the records\n"
            "# stof.integrations.hf_layers' plans of this model look up.\n",
            mt, path);
    fprintf(out, "mask %s\n", spec);
    fprintf(out, "layer %s hidden=%d heads=%d ffn=%d", mt, hidden, heads, ffn);
    if (kvh && kvh != heads)
        fprintf(out, " kv_heads=%d", kvh);
    fprintf(out, " act=silu norm=rms pre gated%s%s", bias ? "" : " no_bias",
            !strcmp(mt, "qwen3") ? " qk_norm" : "");
    if (hd * heads != hidden)
        fprintf(out, " head_dim=%d", hd);
    /* (the numbers as the JSON gives them: the same floats as Python's) */
    fprintf(out, " eps=%.17g", eps);
    if (scaled)
        fprintf(out, " rope=table\n");
    else
        fprintf(out, " rope=%.17g\n", theta);
    fprintf(out, "tokens");
    if (o->n_tokens)
        for (int i = 0; i < o->n_tokens; i++)
            fprintf(out, " %s", o->tokens[i]);
    else
        fprintf(out, " 1x128 8x512 16x2048");
    fprintf(out, "\ndtype %s\n", dt);
    return 1;
}

int cmd_hf_workload(stof_context *ctx, const opts *o)
{
    (void)ctx;
    if (o->dtype && strcmp(o->dtype, "fp16") && strcmp(o->dtype, "bf16")) {
        err("hf-workload: --dtype %s: fp16 or bf16", o->dtype);
        return EXIT_USAGE;
    }
    for (int i = 0; i < o->n_tokens; i++) { /* (BxS, both positive) */
        long b = 0, s = 0;
        char tail = 0;
        if (sscanf(o->tokens[i], "%ldx%ld%c", &b, &s, &tail) != 2 || b < 1 ||
            s < 1 || b > (1 << 30) || s > (1 << 30)) {
            err("hf-workload: --tokens %s: batch x sequence, e.g. 8x512",
                o->tokens[i]);
            return EXIT_USAGE;
        }
    }
    json_error_t je;
    json_t *c = json_load_file(o->pos[0], 0, &je);
    if (!json_is_object(c)) {
        err("hf-workload: %s: %s", o->pos[0],
            c ? "not a JSON object" : je.text);
        json_decref(c);
        return EXIT_FAIL;
    }
    char msg[256];
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) {
        json_decref(c);
        err("hf-workload: out of memory");
        return EXIT_FAIL;
    }
    const int ok = workload_of(c, o->pos[0], o, mem, msg, sizeof(msg));
    fclose(mem);
    json_decref(c);
    if (!ok) {
        err("hf-workload: %s: %s", o->pos[0], msg);
        free(text);
        return EXIT_FAIL;
    }
    fwrite(text, 1, len, stdout);
    free(text);
    return EXIT_OK;
}
