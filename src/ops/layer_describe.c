/*
 * layer_describe.c - stof_layer_describe: a planned layer as JSON (its
 * descriptor, fusion scheme, kernels with their configurations and times,
 * where its plan's time went, the device memory it holds). The chain and
 * planning: layer.c.
 */
#include "layer_int.h"

#include <jansson.h>

#include <stdlib.h>
#include <string.h>

#define g_slot stof__layer_g_slot
#define n_slot stof__layer_n_slot
#define j_name stof__layer_j_name

static json_t *jnum(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

/* Step i of the scheme as a JSON object. */
static json_t *describe_step(const stof_layer *L, const step *st)
{
    if (st->kind == STEP_ATTN) {
        size_t need = 0;
        (void)stof_plan_describe(L->attn, NULL, 0, &need);
        char *a = malloc(need + 1);
        json_t *plan = a && stof_plan_describe(L->attn, a, need + 1, NULL) ==
                                STOF_OK
                           ? json_loads(a, 0, NULL)
                           : NULL;
        free(a);
        return json_pack("{s:s, s:o}", "op", "attention", "plan",
                         plan ? plan : json_object());
    }
    if (st->kind == STEP_GEMM) {
        const gemm_op *g = &L->g[st->op];
        char cfg[256];
        stof__layer_gemm_config_json(g, cfg, sizeof(cfg));
        json_t *c = json_loads(cfg, 0, NULL);
        json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:i, s:o, s:o}", "op",
                              g_slot[st->op], "kernel",
                              g->lt ? "cublaslt" : "gemm", "m", g->M, "n",
                              g->N, "k", g->K, "config",
                              c ? c : json_object(), "ms", jnum(g->ms));
        if (o && st->stack_end) /* runs in stacks only, for the step before */
            json_object_set_new(o, "stack_end", json_true());
        /* RoPE: in the GEMM's epilogue, or by the rope kernel after it; a
         * QK norm (and RoPE) by the qk kernel after it */
        if (o && g->qk_norm)
            json_object_set_new(o, "qk_norm", json_string("kernel"));
        if (o && g->epi.rope)
            json_object_set_new(o, "rope",
                                json_string(stof__layer_rope_split(
                                                g, g->lt, &g->cfg)
                                                ? "kernel"
                                                : "fused"));
        return o;
    }
    const norm_op *nn = &L->n[st->op];
    return json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:o}", "op",
                     n_slot[st->op], "kernel", "norm", "warps", nn->warps,
                     "bias", nn->bias, "residual", nn->res, "write_pre",
                     nn->pre, "ms", jnum(nn->ms));
}

stof_status stof_layer_describe(const stof_layer *L, char *buf, size_t n,
                                size_t *needed)
{
    if (needed)
        *needed = 0;
    if (!L || (!buf && n > 0))
        return STOF_ERR_INVALID_ARGUMENT;
    const stof_layer_desc *d = &L->d;
    static const char *const acts[] = {"none", "gelu_tanh", "gelu_erf",
                                       "relu", "silu"};
    json_t *steps = json_array();
    int stack_end = 0;
    for (int i = 0; steps && i < L->n_steps; i++) {
        json_array_append_new(steps, describe_step(L, &L->steps[i]));
        stack_end += L->steps[i].stack_end;
    }
    /* Whether its launches ask for programmatic dependent launch: the
     * plan's choice unless STOF_PDL decides; the search's timing of it
     * when this plan's search made it. */
    const int pdl = stof__pdl_for(L->pdl);
    json_t *o = json_pack(
        "{s:{s:i, s:i, s:i, s:i, s:i, s:b, s:i, s:b, s:s, s:s, s:s, s:i, "
        "s:o, s:o},"
        " s:s, s:s, s:o, s:{s:o, s:o, s:o}, s:o, s:o, s:o,"
        " s:{s:s, s:s, s:i, s:b, s:o},"
        " s:{s:I, s:I}, s:o}",
        "desc", "batch", d->batch, "seq", d->seq, "hidden", d->hidden,
        "heads", d->heads, "kv_heads",
        d->kv_heads > 0 ? d->kv_heads : d->heads, "biases", !d->no_bias,
        "ffn", d->ffn, "gated", d->gated, "dtype",
        stof__layer_dtype_str(d->dtype), "act", acts[d->act], "norm",
        d->norm == STOF_NORM_LAYER ? "layernorm" : "rmsnorm", "pre_norm",
        d->pre_norm, "eps", jnum((double)L->eps), "rope",
        L->rope ? json_pack("{s:o, s:i, s:o, s:s}", "theta",
                            d->rope_freq ? json_null()
                                         : jnum((double)d->rope_theta),
                            "dim", L->rope, "scale",
                            jnum((double)L->rope_scale), "freq",
                            d->rope_freq ? "table" : "theta")
                : json_null(),
        "key", L->key, "source",
        L->source, "plan_s", jnum(L->tune_s), "plan_ms", "attention",
        jnum(L->plan_ms[0]), "buffers", jnum(L->plan_ms[1]), "kernels",
        jnum(L->plan_ms[2]), "verify_ms", jnum(L->verify_ms),
        "layer_ms", jnum(L->layer_ms), "model_ms", jnum(L->model_ms),
        "scheme", "junction_a", j_name[L->ja], "junction_b",
        d->pre_norm ? (L->jb == J_FUSED ? "stack" : "none") : j_name[L->jb],
        "kernels", L->n_steps - stack_end, "pdl", pdl, "pdl_ms",
        L->pdl_ms[0] > 0 ? json_pack("{s:o, s:o}", "off", jnum(L->pdl_ms[0]),
                                     "on", jnum(L->pdl_ms[1]))
                         : json_null(),
        "device_bytes",
        "buffers",
        (json_int_t)(L->mem_bytes - L->lt_mem_bytes +
                     (L->buf[SYM_G] ? (size_t)L->M *
                                          (size_t)stof__layer_tok_ld(L, SYM_G) *
                                          2
                                    : 0)),
        "cublaslt",
        (json_int_t)(L->lt_mem_bytes + (L->lt_in_mem ? 0 : L->lt_ws_bytes)),
        "kernels", steps ? steps : json_array());
    json_t *jd = o ? json_object_get(o, "desc") : NULL;
    if (jd) { /* (after "rope") */
        json_object_set_new(jd, "qk_norm", json_boolean(d->qk_norm));
        json_object_set_new(jd, "head_dim", json_integer(L->hd));
    }
    return stof__json_out(o, buf, n, needed);
}
