/*
 * attention_describe.c - stof_plan_describe: what a plan is (its kernel,
 * template parameters, problem, mask, where its time went) as JSON.
 */
#include "attention_int.h"

#include <jansson.h>

#include <math.h>
#include <stdio.h>

/* A number for a description; null when it is not finite (JSON has no
 * NaN). */
static json_t *jnum(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

/* The kernel's template and its parameters. */
static json_t *describe_kernel(const stof_plan *p, const char *dt,
                               const char **tpl)
{
    const stof_attention_desc *d = &p->desc;
    const int group = p->group > 1 ? p->group : 1;
    if (p->kind == STOF_KERNEL_REFERENCE) {
        *tpl = "attn_reference.cu";
        return json_pack("{s:i, s:s, s:i}", "HEAD_DIM", d->head_dim, "DTYPE",
                         dt, "WARPS", REF_WARPS);
    }
    json_t *j;
    if (p->kind >= STOF_KERNEL_WGMMA) {
        *tpl = "attn_wgmma.cu";
        j = json_pack("{s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i}",
                      "HEAD_DIM", d->head_dim, "DTYPE", dt, "BLOCK_M",
                      stof__wgmma_block_m(&p->wcfg), "BLOCK_N",
                      p->wcfg.block_n, "STAGES", p->wcfg.stages, "OVERLAP",
                      p->wcfg.overlap, "GATHER", p->wcfg.gather, "ROW_GROUP",
                      group, "PERSIST", p->wcfg.persist);
    } else {
        *tpl = "attn_block.cu";
        j = json_pack("{s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:i}", "HEAD_DIM",
                      d->head_dim, "DTYPE", dt, "BLOCK_M", p->cfg.block_m,
                      "BLOCK_N", p->cfg.block_n, "WARPS", p->cfg.warps,
                      "STAGES", p->cfg.stages, "GATHER", p->cfg.gather,
                      "ROW_GROUP", group);
    }
    /* Split-KV kernels: CTAs per row block (SPLIT=1, attn_split.cuh);
     * score modifiers built in (SOFTCAP=1, ALIBI=1, BIAS=1). */
    if (j && p->n_split > 1)
        json_object_set_new(j, "SPLITS", json_integer(p->n_split));
    if (j && (p->mods & STOF_MOD_SOFTCAP))
        json_object_set_new(j, "SOFTCAP", json_real(d->softcap));
    if (j && (p->mods & STOF_MOD_ALIBI))
        json_object_set_new(j, "ALIBI", json_integer(1));
    if (j && (p->mods & STOF_MOD_BIAS))
        json_object_set_new(j, "BIAS", json_integer(1));
    return j;
}

stof_status stof_plan_describe(const stof_plan *p, char *buf, size_t n,
                               size_t *needed)
{
    if (needed)
        *needed = 0;
    if (!p || (!buf && n > 0))
        return STOF_ERR_INVALID_ARGUMENT;
    const stof_attention_desc *d = &p->desc;
    static const char *const layouts[] = {"BHSD", "BSHD", "strided"};
    const char *dt = d->dtype == STOF_DTYPE_FP16 ? "fp16" : "bf16";
    const char *tpl = "";
    json_t *params = describe_kernel(p, dt, &tpl);
    char th[17];
    snprintf(th, sizeof(th), "%016llx",
             (unsigned long long)stof_template_hash());
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:o, s:s, s:s, s:s,"
        " s:{s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:o},"
        " s:{s:s, s:o}, s:s, s:i, s:o, s:o, s:o, s:o}",
        "op", "attention", "kernel", stof__kernel_kind_name(p->kind),
        "template", tpl, "params", params ? params : json_object(), "source",
        p->source ? p->source : "compiled", "key", p->key, "arch", p->arch,
        "problem", "batch", d->batch, "heads", d->heads, "seq_q", d->seq_q,
        "seq_k", d->seq_k, "head_dim", d->head_dim, "dtype", dt, "layout",
        layouts[d->layout], "scale", jnum((double)p->scale), "mask", "digest",
        p->mask_hex, "density", jnum(p->mask_density), "template_hash", th,
        "candidates", p->n_candidates, "predicted_ms", jnum(p->predicted_ms),
        "compile_ms", jnum(p->compile_ms), "load_ms", jnum(p->load_ms),
        "verify_ms", jnum(p->verify_ms));
    if (o)
        json_object_set_new(o, "formats_built_on",
                            json_string(p->formats_gpu ? "gpu" : "host"));
    if (o) /* the context's shared block format (format_cache.c) */
        json_object_set_new(o, "formats_shared", json_boolean(p->fmt_ref != NULL));
    if (o) /* where the plan's own time went */
        json_object_set_new(o, "plan_ms",
                            json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "key",
                                      jnum(p->key_ms), "lookup",
                                      jnum(p->lookup_ms), "formats",
                                      jnum(p->formats_ms), "compile",
                                      jnum(p->compile_ms), "load",
                                      jnum(p->load_ms), "verify",
                                      jnum(p->verify_ms)));
    if (o && p->time_ms > 0) {
        json_object_set_new(o, "time_ms", jnum(p->time_ms));
        json_object_set_new(o, "runner_up_ms", jnum(p->runner_up_ms));
        json_object_set_new(o, "model_choice_ms", jnum(p->model_ms));
    } else if (o) {
        json_object_set_new(o, "time_ms", json_null());
    }
    if (o && p->gqa_rows)
        json_object_set_new(
            o, "gqa_rows",
            json_pack("{s:i, s:s}", "group", p->gqa_rows, "view",
                      "each K/V head's query heads planned as the rows of "
                      "one head: problem.heads is kv_heads, problem.seq_q "
                      "group * seq_q"));
    if (o && p->family)
        json_object_set_new(
            o, "family",
            json_pack("{s:s, s:s, s:s, s:I, s:i}", "spec", p->family_spec,
                      "key_text", p->family_key, "formats",
                      "built on the GPU per run", "workspace_bytes",
                      (json_int_t)p->mb_ws.bytes, "packed_sequences",
                      p->n_seq));
    return stof__json_out(o, buf, n, needed);
}
