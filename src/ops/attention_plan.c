/*
 * attention_plan.c - choosing a plan's kernel (stof_attention_plan, the
 * batch warm-up): the tuning database first (a record from elsewhere is
 * verified on this GPU at its first use), else in cache-only mode the cost
 * model's choice with the miss recorded, else the two-stage search
 * (search.h) over the attention operation (attention_search.c), whose
 * winner is stored.
 */
#include "attention_int.h"

#include <jansson.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The search's verification tolerance (relative error), also the
 * first-use check's. */
#define VERIFY_TOLERANCE 1e-2

/* --- the tuning database ----------------------------------------------- */

stof_db *stof__ctx_db(stof_context *ctx)
{
    if (!ctx->db_tried) {
        ctx->db_tried = 1;
        ctx->db_close = stof__db_close;
        if (stof__db_open(STOF_DB_SINK(ctx), ctx->user_db,
                          (const char *const *)ctx->system_dbs,
                          &ctx->db) != STOF_OK)
            stof__log(ctx, STOF_LOG_WARN, "tuning database unavailable: %s",
                      stof_errmsg(ctx));
    }
    return ctx->db;
}

static const char *dtype_name(stof_dtype t)
{
    return t == STOF_DTYPE_FP16 ? "fp16" : "bf16";
}

static const char *layout_str(stof_layout l)
{
    return l == STOF_LAYOUT_BHSD     ? "BHSD"
           : l == STOF_LAYOUT_BSHD   ? "BSHD"
           : l == STOF_LAYOUT_PACKED ? "packed"
                                     : "strided";
}

/* A candidate's configuration as the JSON stored in records (read back by
 * stof__attention_record_candidate). */
static void cand_to_json(const stof_candidate *c, char *buf, size_t n)
{
    stof__json_text(
        json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}",
                  "kind", stof__kernel_kind_name(c->kind), "block_m",
                  c->cfg.block_m, "block_n", c->cfg.block_n, "warps",
                  c->cfg.warps, "stages", c->cfg.stages, "overlap",
                  c->wcfg.overlap, "group", c->group, "splits",
                  c->splits > 1 ? c->splits : 0, "mods",
                  c->kind >= STOF_KERNEL_WGMMA ? c->wcfg.mods : c->cfg.mods,
                  "persist", c->kind >= STOF_KERNEL_WGMMA ? c->wcfg.persist
                                                           : 0),
        buf, n);
}

int stof__attention_record_candidate(const stof_db_record *r,
                                     stof_candidate *c, char *why, size_t n)
{
    memset(c, 0, sizeof(*c));
    if (strcmp(r->op, "attention") != 0)
        return stof__why(why, n, "not an attention record");
    if (!strcmp(r->kernel, "block"))
        c->kind = STOF_KERNEL_BLOCK;
    else if (!strcmp(r->kernel, "rowwise"))
        c->kind = STOF_KERNEL_ROWWISE;
    else if (!strcmp(r->kernel, "wgmma"))
        c->kind = STOF_KERNEL_WGMMA;
    else if (!strcmp(r->kernel, "wgmma-gather"))
        c->kind = STOF_KERNEL_WGMMA_GATHER;
    else if (!strcmp(r->kernel, "reference"))
        c->kind = STOF_KERNEL_REFERENCE;
    else
        return stof__why(why, n, "unknown attention kernel");
    static const char *const keys[] = {"block_m", "block_n", "warps",
                                       "stages",  "overlap", "group"};
    int v[6];
    char kind[16];
    const int ok = stof__json_ints(r->config, keys, 6, v) &&
                   stof__json_str(r->config, "kind", kind, sizeof(kind)) &&
                   strcmp(kind, r->kernel) == 0;
    c->cfg.block_m = v[0];
    c->cfg.block_n = v[1];
    c->cfg.warps = v[2];
    c->cfg.stages = v[3];
    c->wcfg.overlap = v[4];
    c->group = v[5];
    if (!ok)
        return stof__why(why, n, "unreadable kernel configuration");
    /* Records of split-KV kernels say how many CTAs (older ones have no
     * "splits": not split). */
    static const char *const skey[] = {"splits"};
    int splits = 0;
    if (strstr(r->config, "\"splits\"") &&
        !stof__json_ints(r->config, skey, 1, &splits))
        return stof__why(why, n, "unreadable split count");
    if (splits < 0 || splits == 1 || splits > STOF_SPLIT_MAX ||
        (splits && c->kind == STOF_KERNEL_REFERENCE))
        return stof__why(why, n, "split count %d is out of range", splits);
    c->splits = splits;
    c->cfg.split = c->wcfg.split = splits > 1;
    /* Score modifiers the kernel was built for (older records: none). */
    static const char *const mkey[] = {"mods"};
    int mods = 0;
    if (strstr(r->config, "\"mods\"") &&
        !stof__json_ints(r->config, mkey, 1, &mods))
        return stof__why(why, n, "unreadable score modifiers");
    if (mods < 0 || mods > STOF_MOD_ALL ||
        (mods && c->kind == STOF_KERNEL_REFERENCE))
        return stof__why(why, n, "score modifiers %d are out of range",
                         mods);
    c->cfg.mods = c->wcfg.mods = mods;
    /* The persistent wgmma kernel (older records: not persistent). */
    static const char *const pkey[] = {"persist"};
    int persist = 0;
    if (strstr(r->config, "\"persist\"") &&
        !stof__json_ints(r->config, pkey, 1, &persist))
        return stof__why(why, n, "unreadable persist flag");
    if (persist != 0 && (persist != 1 || c->kind != STOF_KERNEL_WGMMA))
        return stof__why(why, n, "persist %d is out of range for %s", persist,
                         r->kernel);
    c->wcfg.persist = persist;
    c->cfg.gather = c->kind == STOF_KERNEL_ROWWISE;
    c->wcfg.block_n = c->cfg.block_n;
    c->wcfg.stages = c->cfg.stages;
    c->wcfg.block_m = c->cfg.block_m;
    c->wcfg.gather = c->kind == STOF_KERNEL_WGMMA_GATHER;
    c->predicted_ms = r->model_ms;
    /* Parameters in range for the kernel (no device: shared memory is
     * checked when the cubin is loaded). */
    if (c->group < 0 || c->group > 16)
        return stof__why(why, n, "row group %d is out of range", c->group);
    if (r->head_dim < 1 || r->head_dim > 256 || r->batch < 1 ||
        r->heads < 1 || r->seq_q < 1 || r->seq_k < 1)
        return stof__why(why, n, "problem sizes out of range");
    char cw[200];
    switch (c->kind) {
    case STOF_KERNEL_BLOCK:
    case STOF_KERNEL_ROWWISE:
        if (!stof__block_cfg_valid(NULL, r->head_dim, &c->cfg, cw,
                                   sizeof(cw)))
            return stof__why(why, n, "invalid %s configuration: %s",
                             r->kernel, cw);
        break;
    case STOF_KERNEL_WGMMA:
    case STOF_KERNEL_WGMMA_GATHER:
        if (!stof__wgmma_cfg_valid(NULL, r->head_dim, &c->wcfg, cw,
                                   sizeof(cw)))
            return stof__why(why, n, "invalid %s configuration: %s",
                             r->kernel, cw);
        if (strcmp(r->arch, "sm_90a") != 0)
            return stof__why(why, n, "a %s kernel must be built for sm_90a",
                             r->kernel);
        break;
    default:
        break;
    }
    return 1;
}

static void fill_record(stof_context *ctx, const stof_attention_desc *d,
                        const stof_attn_problem *pr, const char *key,
                        const char *mask_hex, const stof_candidate *winner,
                        const stof_search_result *res, uint64_t seed,
                        stof_db_record *r)
{
    memset(r, 0, sizeof(*r));
    const stof_device *dev = &ctx->device;
    snprintf(r->key, sizeof(r->key), "%s", key);
    snprintf(r->op, sizeof(r->op), "attention");
    snprintf(r->mask_digest, sizeof(r->mask_digest), "%s", mask_hex);
    const char *spec = pr->m ? pr->m->spec : stof_mask_family_spec(pr->fam);
    if (spec)
        snprintf(r->mask_spec, sizeof(r->mask_spec), "%s", spec);
    r->batch = d->batch;
    r->heads = d->heads;
    r->seq_q = d->seq_q;
    r->seq_k = d->seq_k;
    r->head_dim = d->head_dim;
    snprintf(r->dtype, sizeof(r->dtype), "%s", dtype_name(d->dtype));
    snprintf(r->layout, sizeof(r->layout), "%s", layout_str(d->layout));
    stof__record_env(ctx, r);
    snprintf(r->kernel, sizeof(r->kernel), "%s",
             stof__kernel_kind_name(winner->kind));
    cand_to_json(winner, r->config, sizeof(r->config));
    snprintf(r->arch, sizeof(r->arch), "%s",
             winner->kind >= STOF_KERNEL_WGMMA ? "sm_90a" : dev->arch);
    r->cubin = res->winner_art;
    r->cubin_size = res->winner_art_size;
    r->time_ms = res->winner_ms;
    r->runner_up_ms = res->runner_up_ms;
    r->model_ms = res->model_ms;
    r->n_candidates = res->n_timed;
    r->verified = 1;
    stof__json_text(json_pack("{s:s, s:i, s:i, s:i, s:f, s:I}", "method",
                              "cuda events, median, L2 flushed", "candidates",
                              res->n_selected, "rejected", res->n_rejected,
                              "failed", res->n_failed, "tolerance",
                              VERIFY_TOLERANCE, "seed", (json_int_t)seed),
                    r->measured, sizeof(r->measured));
}

/* Validate and normalise a problem, compute its key (or take `key_in`);
 * NO_DEVICE without a GPU. */
static stof_status plan_begin(stof_context *ctx, const stof_attention_desc *d,
                              const stof_attn_problem *pr, const char *key_in,
                              stof_attention_desc *nd, char mask_hex[33],
                              char key[33])
{
    float scale;
    stof_status st = pr->m ? stof__attention_check_ready(ctx, d, pr->m, &scale)
                           : stof__attention_check_problem(ctx, d, &scale);
    if (st != STOF_OK)
        return st;
    if (!pr->m && !ctx->device.ok)
        return stof__fail(ctx, STOF_ERR_NO_DEVICE,
                          "stof_attention_plan_family needs a GPU: %s",
                          ctx->device.why[0] ? ctx->device.why
                                             : "no usable CUDA device");
    *nd = *d;
    stof__attention_normalise(nd);
    if (pr->m)
        stof_mask_digest(pr->m, NULL, mask_hex);
    else /* a family's records name its key */
        snprintf(mask_hex, 33, "%s", key_in ? key_in : "");
    if (key_in)
        snprintf(key, 33, "%s", key_in);
    else
        stof__attention_key(ctx, nd, mask_hex, key, NULL, 0);
    return STOF_OK;
}

/* A plan of problem pr for candidate c with the given cubin. */
static stof_status plan_cubin(stof_context *ctx, const stof_attention_desc *nd,
                              const stof_attn_problem *pr,
                              const stof_candidate *c, const void *cubin,
                              size_t size, uint64_t hash, stof_plan **out)
{
    return pr->m ? stof__plan_from_cubin(ctx, nd, pr->m, c, cubin, size, hash,
                                         out)
                 : stof__family_plan_from_cubin(ctx, nd, pr->fam, c, cubin,
                                                size, hash, out);
}

/* Whether candidate c's kernel can run with nd's strides. The key does
 * not name the layout (problem_key.c), so a record tuned with one layout
 * serves others; the gather kernels limit strides (K/V row offsets in
 * 16-byte units must fit 32 bits) and the wgmma kernels take none of 0
 * (stof__wgmma_strides_ok), as the cost model does when it ranks them. */
static int kernel_takes_strides(const stof_candidate *c,
                                const stof_attention_desc *nd)
{
    if ((c->kind == STOF_KERNEL_WGMMA || c->kind == STOF_KERNEL_WGMMA_GATHER) &&
        !stof__wgmma_strides_ok(nd))
        return 0;
    if (c->kind != STOF_KERNEL_ROWWISE && c->kind != STOF_KERNEL_WGMMA_GATHER)
        return 1;
    const int64_t s = nd->k_stride[2] > nd->v_stride[2] ? nd->k_stride[2]
                                                        : nd->v_stride[2];
    return (double)(nd->seq_k - 1) * (double)s / 8.0 < 4294967296.0;
}

int stof__test_no_reference;

/* Check a plan made from a database record on this GPU before its first
 * real use: run it on seeded random inputs for one batch element and up
 * to two heads (the kernel's code is the same for every (batch, head); two
 * heads exercise the head offsets) over the whole sequence, and compare
 * every output row with the reference kernel. 1 when it matches (within
 * the search's tolerance), else 0 with the reason in why; -1 (why set)
 * when the check itself could not run here for want of memory (for the
 * reference's inputs or kernel), which says nothing of the record. */
static int verify_here(stof_context *ctx, const stof_plan *p,
                       const stof_attn_problem *pr, char *why, size_t n)
{
    if (stof__test_no_reference) {
        snprintf(why, n, "the reference could not run: out of memory "
                         "(injected by a test)");
        return -1;
    }
    stof_attention_desc vd = p->desc;
    vd.alibi_slopes = p->alibi_host; /* the reference's ALiBi, if any */
    vd.batch = 1;
    vd.heads = p->desc.heads < 2 ? p->desc.heads : 2;
    if (p->desc.kv_heads > 0) { /* grouped: two K/V heads' groups */
        const int g = stof__kv_group(&p->desc);
        vd.kv_heads = p->desc.kv_heads < 2 ? p->desc.kv_heads : 2;
        vd.heads = g * vd.kv_heads;
    }
    vd.layout = STOF_LAYOUT_BHSD;
    stof_attention_op *a = NULL;
    stof_status st;
    if (pr->m) {
        stof__attention_normalise(&vd);
        st = stof__attention_op_new(ctx, &vd, pr->m, NULL, 0, 0x7e57ed5eedull,
                                    1, &a, NULL);
    } else {
        /* A family: every sequence (each has its own instance), the first
         * head of each against the reference (every head for a window per
         * head: its formats are per (sequence, head)). */
        vd.batch = p->desc.batch;
        if (stof__family_spec(pr->fam)->uses & STOF_SPEC_USES_HEAD) {
            vd.heads = p->desc.heads;
            vd.kv_heads = p->desc.kv_heads;
        }
        stof__attention_normalise(&vd);
        st = stof__attention_family_op_new(ctx, &vd, pr->fam, pr->dev, NULL,
                                           0, 0x7e57ed5eedull, 1, 1, &a,
                                           NULL);
    }
    if (st != STOF_OK) {
        snprintf(why, n, "the reference could not run: %s",
                 stof_errmsg(ctx));
        return st == STOF_ERR_OUT_OF_MEMORY ? -1 : 0;
    }
    double rel = INFINITY;
    char err[256] = "";
    const int failed = stof__attention_op_check(a, p, &rel, err, sizeof(err));
    stof__attention_op_free(&a);
    if (failed) {
        snprintf(why, n, "%s", err);
        return 0;
    }
    if (!(rel <= VERIFY_TOLERANCE)) {
        snprintf(why, n, "wrong result: relative error %.3g (tolerance %g)",
                 rel, VERIFY_TOLERANCE);
        return 0;
    }
    return 1;
}

/* Use a record's plan on this host only once it is trusted here (db.h,
 * "Local trust"): verify it at its first use and remember that. Returns
 * 1 when the plan may run; 0 when the record failed (logged; a user
 * database record that fails is deleted, so that tuning can replace it)
 * or could not be checked here (logged; kept, untrusted, for the next
 * plan to check: a moment without memory must not cost a host its
 * tuning records). */
static int trust_record(stof_context *ctx, stof_db *db, stof_plan *p,
                        const stof_attn_problem *pr, const stof_db_record *rec)
{
    if (stof__db_trusted(db, rec))
        return 1;
    char why[512];
    const double t0 = stof__now_ms();
    const int ok = verify_here(ctx, p, pr, why, sizeof(why));
    p->verify_ms = stof__now_ms() - t0;
    if (ok < 0) {
        ctx->records_unchecked++;
        snprintf(ctx->unchecked_why, sizeof(ctx->unchecked_why), "%s", why);
        stof__log(ctx, STOF_LOG_WARN,
                  "tuning record %s (%s database, made on %s) could not be "
                  "verified on this GPU: %s; not used this time, kept",
                  rec->key, rec->source, rec->host, why);
        return 0;
    }
    if (ok) {
        stof__db_trust(db, rec);
        stof__log(ctx, STOF_LOG_INFO,
                  "tuning record %s (%s database, made on %s) verified on "
                  "this GPU in %.1f ms",
                  rec->key, rec->source, rec->host, p->verify_ms);
        return 1;
    }
    stof__log(ctx, STOF_LOG_WARN,
              "tuning record %s (%s database, made on %s) failed "
              "verification on this GPU: %s; not used",
              rec->key, rec->source, rec->host, why);
    if (rec->layer == 0)
        stof__db_forget(db, rec->key, rec->content_hash);
    return 0;
}

/* A lazily looked-up record's plan once its module, found in the cache a
 * moment before, has been evicted: the record read whole and loaded. */
static stof_status load_whole(stof_context *ctx, stof_db *db,
                              const stof_attention_desc *nd,
                              const stof_attn_problem *pr,
                              const stof_candidate *c, const char *key,
                              stof_db_record *rec, stof_plan **p)
{
    stof__db_record_clear(rec);
    stof_status st = stof__db_lookup_again(db, key, rec);
    if (st == STOF_OK && !rec->cubin)
        st = stof__fail(ctx, STOF_ERR_NOT_FOUND, "record %s: no cubin", key);
    if (st == STOF_OK)
        st = plan_cubin(ctx, nd, pr, c, rec->cubin, rec->cubin_size,
                        rec->cubin_xxh3, p);
    return st;
}

/* A plan from the database, or NULL (a miss, or an unusable record: logged
 * and treated as a miss). */
static stof_plan *plan_from_db(stof_context *ctx, const stof_attention_desc *nd,
                               const stof_attn_problem *pr, const char *key)
{
    stof_db *db = stof__ctx_db(ctx);
    stof_db_record rec;
    const double t0 = stof__now_ms();
    if (!db || ctx->settings.tuning_mode == STOF_TUNE_FORCE ||
        stof__db_lookup_lazy(db, key, &rec) != STOF_OK)
        return NULL;
    /* The record without its cubin when the memo serves it and the
     * context's cache holds its module (a warm plan: no copy, no hash of
     * the bytes); read whole when the module must be loaded. */
    if (!rec.cubin && rec.cubin_size &&
        !stof__module_cached(ctx, rec.cubin_xxh3, rec.cubin_size)) {
        stof__db_record_clear(&rec);
        if (stof__db_lookup_again(db, key, &rec) != STOF_OK)
            return NULL;
    }
    const double lookup_ms = stof__now_ms() - t0;
    stof_candidate c;
    stof_plan *p = NULL;
    stof_status st;
    char why[256];
    const int lazy = !rec.cubin;
    ctx->hit_no_compile = 1; /* a hit compiles nothing */
    if (!stof__attention_record_candidate(&rec, &c, why, sizeof(why)))
        stof__log(ctx, STOF_LOG_WARN, "tuning record %s: %s (%s): ignored",
                  key, why, rec.config);
    else if (!kernel_takes_strides(&c, nd))
        stof__log(ctx, STOF_LOG_INFO,
                  "tuning record %s: its %s kernel cannot address these "
                  "strides: planning without it",
                  key, rec.kernel);
    else if (!pr->m && c.kind != STOF_KERNEL_BLOCK &&
             c.kind != STOF_KERNEL_WGMMA)
        stof__log(ctx, STOF_LOG_WARN,
                  "tuning record %s: a %s kernel does not read the family's "
                  "GPU-built formats: ignored",
                  key, rec.kernel);
    else if ((st = plan_cubin(ctx, nd, pr, &c, rec.cubin, rec.cubin_size,
                              rec.cubin_xxh3, &p)) != STOF_OK &&
             !(st == STOF_ERR_NOT_FOUND && !rec.cubin &&
               (st = load_whole(ctx, db, nd, pr, &c, key, &rec, &p)) ==
                   STOF_OK)) {
        if (st == STOF_ERR_OUT_OF_MEMORY) { /* not the record's fault */
            ctx->records_unchecked++;
            snprintf(ctx->unchecked_why, sizeof(ctx->unchecked_why),
                     "it could not be loaded here: %.400s",
                     stof_errmsg(ctx));
        }
        stof__log(ctx, STOF_LOG_WARN,
                  "tuning record %s could not be loaded (%s): ignored", key,
                  stof_errmsg(ctx));
    }
    ctx->hit_no_compile = 0;
    if (p && !trust_record(ctx, db, p, pr, &rec)) {
        stof__plan_release(p);
        p = NULL;
    }
    if (p) {
        p->source = !strcmp(rec.source, "user") ? "user db" : "system db";
        p->time_ms = rec.time_ms;
        p->runner_up_ms = rec.runner_up_ms;
        p->model_ms = rec.model_ms;
        p->n_candidates = rec.n_candidates;
        p->lookup_ms = lookup_ms;
        p->by_hash = lazy && !rec.cubin;
        snprintf(p->key, sizeof(p->key), "%s", key);
    }
    stof__db_record_clear(&rec);
    return p;
}

/* A family's plan for the cost model's best block-format candidate,
 * compiled. */
static stof_status family_model_plan(stof_context *ctx,
                                     const stof_attention_desc *nd,
                                     const stof_attn_problem *pr,
                                     stof_plan **out)
{
    stof_candidate c;
    int n = 0;
    stof_status st = stof__family_rank(ctx, nd, pr, &c, 1, &n);
    if (st == STOF_ERR_UNSUPPORTED)
        return stof__fail(ctx, st,
                          "no block-format kernel supports head_dim %d on "
                          "this device",
                          nd->head_dim);
    if (st != STOF_OK)
        return st;
    void *cubin = NULL;
    size_t size = 0;
    const double t0 = stof__now_ms();
    st = stof__kernel_cubin(ctx, &c, nd->head_dim, nd->dtype, &cubin, &size);
    const double ms = stof__now_ms() - t0;
    if (st == STOF_OK)
        st = stof__family_plan_from_cubin(ctx, nd, pr->fam, &c, cubin, size,
                                          0, out);
    free(cubin);
    if (st == STOF_OK) {
        (*out)->compile_ms = ms;
        (*out)->n_candidates = 1;
    }
    return st;
}

/* Cache-only mode: record the miss and plan the model's choice. Also (miss
 * 0: nothing to record) for a record this host could not load or check
 * for want of memory, in every mode: tuning would need more memory
 * still, and the record is kept for the next plan. */
static stof_status plan_fallback(stof_context *ctx, const stof_attention_desc *d,
                                 const stof_attention_desc *nd,
                                 const stof_attn_problem *pr,
                                 const char *mask_hex, const char *key,
                                 int miss, stof_plan **out)
{
    const stof_mask *m = pr->m;
    stof_db *db = stof__ctx_db(ctx);
    if (miss && db && stof__db_writable(db)) {
        /* Everything `stof-tune pending` needs to plan it again: the
         * problem with its strides, and the mask (spec, and its bits
         * below), or the family (spec, the caller's descriptor and the
         * sample instance below). Specs never contain quotes or
         * backslashes. */
        const stof_attention_desc *pd = !m && pr->user ? pr->user : nd;
        json_t *pj = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:f}",
                               "op", "attention", "batch", pd->batch, "heads",
                               pd->heads, "seq_q", pd->seq_q, "seq_k",
                               pd->seq_k, "head_dim", pd->head_dim, "dtype",
                               dtype_name(pd->dtype), "layout",
                               layout_str(pd->layout), "scale",
                               (double)pd->scale);
        const int64_t *st4[4] = {pd->q_stride, pd->k_stride, pd->v_stride,
                                 pd->o_stride};
        static const char *const names[4] = {"q", "k", "v", "o"};
        for (int t = 0; pj && t < 4; t++)
            for (int i = 0; i < 3; i++) {
                char f[8];
                snprintf(f, sizeof(f), "%s_s%d", names[t], i);
                json_object_set_new(pj, f, json_integer(st4[t][i]));
            }
        if (pj && pd->kv_heads > 0 && pd->kv_heads != pd->heads)
            json_object_set_new(pj, "kv_heads", json_integer(pd->kv_heads));
        /* Score modifiers (the key holds the soft-cap and whether ALiBi
         * is on; the slopes make the problem whole again). */
        if (pj && pd->softcap > 0.0f)
            json_object_set_new(pj, "softcap", json_real(pd->softcap));
        if (pj && pd->alibi_slopes) {
            json_t *a = json_array();
            for (int h = 0; a && h < pd->heads; h++)
                json_array_append_new(a, json_real(pd->alibi_slopes[h]));
            json_object_set_new(pj, "alibi_slopes", a);
        }
        if (pj && pd->bias) {
            json_t *a = json_array();
            for (int i = 0; a && i < 3; i++)
                json_array_append_new(a, json_integer(pd->bias_stride[i]));
            json_object_set_new(pj, "bias_stride", a);
        }
        stof__record_miss(ctx, db, key, pj, m, mask_hex, pr->fam, pd,
                          pr->host);
    }
    stof_status st = m ? stof__attention_plan_kernel(ctx, d, m, NULL, out)
                       : family_model_plan(ctx, nd, pr, out);
    if (st == STOF_OK) {
        (*out)->source = "fallback";
        snprintf((*out)->key, sizeof((*out)->key), "%s", key);
    }
    return st;
}

/* After a search: store the winner (candidate `winner`) and plan from its
 * cubin (consumed). */
static stof_status plan_tuned(stof_context *ctx, const stof_attention_desc *nd,
                              const stof_attn_problem *pr, const char *mask_hex,
                              const char *key, const stof_candidate *winner,
                              stof_search_result *res, uint64_t seed,
                              stof_plan **out)
{
    stof_db *db = stof__ctx_db(ctx);
    if (db && stof__db_writable(db)) {
        stof_db_record rec;
        fill_record(ctx, nd, pr, key, mask_hex, winner, res, seed, &rec);
        if (stof__db_store(db, &rec,
                           ctx->settings.tuning_mode == STOF_TUNE_FORCE,
                           1) != STOF_OK)
            stof__log(ctx, STOF_LOG_WARN,
                      "could not store the tuning result: %s",
                      stof_errmsg(ctx));
    }
    stof_plan *p = NULL;
    stof_status st = plan_cubin(ctx, nd, pr, winner, res->winner_art,
                                res->winner_art_size, 0, &p);
    stof__search_results_free(res, 1);
    if (st != STOF_OK)
        return st;
    p->source = "tuned";
    p->time_ms = res->winner_ms;
    p->runner_up_ms = res->runner_up_ms;
    p->model_ms = res->model_ms;
    p->n_candidates = res->n_timed;
    snprintf(p->key, sizeof(p->key), "%s", key);
    *out = p;
    return STOF_OK;
}

/* --- searching ------------------------------------------------------------ */

enum { MAX_RANKED = 512 };

static stof_search_opts search_opts(const stof_context *ctx)
{
    const stof_settings *st = &ctx->settings;
    stof_search_opts o = {.top_k = st->tuning_top_k > 0 ? st->tuning_top_k : 3,
                          .threads = st->compile_threads,
                          .budget_s = st->tuning_budget_s};
    return o;
}

#define SEARCH_SEED                                                            \
    (ctx->settings.tuning_seed ? ctx->settings.tuning_seed : 0x5eed0f57ull)

/* A miss to tune: the problem, its ranked candidates (stage 1's input) and
 * its attention operation. */
typedef struct miss {
    int i;                   /* the problem's index in the call */
    stof_attention_desc nd;
    stof_attn_problem pr;
    char mask_hex[33], key[33];
    stof_candidate *ranked;
    int n_ranked;
    stof_attention_op *op;
} miss;

static void miss_free(miss *x)
{
    stof__attention_op_free(&x->op);
    free(x->ranked);
    x->ranked = NULL;
}

/* Rank the candidates of x and make its operation. STOF_ERR_UNSUPPORTED
 * when no fast kernel supports the problem. */
static stof_status miss_prepare(stof_context *ctx, miss *x, unsigned kinds,
                                stof_search_op *op)
{
    x->ranked = malloc(sizeof(*x->ranked) * MAX_RANKED);
    if (!x->ranked)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    stof_status st =
        x->pr.m ? stof__cost_rank(ctx, &x->nd, x->pr.m, x->ranked, MAX_RANKED,
                                  &x->n_ranked)
                : stof__family_rank(ctx, &x->nd, &x->pr, x->ranked, MAX_RANKED,
                                    &x->n_ranked);
    if (st != STOF_OK)
        return st;
    if (kinds) { /* only the kinds asked for, in rank order */
        int n = 0;
        for (int i = 0; i < x->n_ranked; i++)
            if (kinds & (1u << x->ranked[i].kind))
                x->ranked[n++] = x->ranked[i];
        x->n_ranked = n;
        if (n == 0)
            return STOF_ERR_UNSUPPORTED;
    }
    stof__log(ctx, STOF_LOG_INFO,
              "tuning attention %dx%dx%dx%d d=%d %s: %d candidates ranked",
              x->nd.batch, x->nd.heads, x->nd.seq_q, x->nd.seq_k,
              x->nd.head_dim, dtype_name(x->nd.dtype), x->n_ranked);
    const double t0 = stof__now_ms();
    st = !x->pr.m /* a family: every sequence, the first head of each */
             ? stof__attention_family_op_new(
                   ctx, &x->nd, x->pr.fam, x->pr.dev, x->ranked, x->n_ranked,
                   SEARCH_SEED, ctx->settings.tuning_reps, 1, &x->op, op)
             : stof__attention_op_new(ctx, &x->nd, x->pr.m, x->ranked,
                                      x->n_ranked, SEARCH_SEED,
                                      ctx->settings.tuning_reps, &x->op, op);
    if (st == STOF_OK)
        stof__log(ctx, STOF_LOG_INFO,
                  "tuning attention: inputs and reference output in %.2f s",
                  (stof__now_ms() - t0) * 1e-3);
    return st;
}

/* Grouped-query attention with short queries (decode, small chunks): the
 * problem seen with the `group` query heads of each K/V head as the rows
 * of one head, row g * seq_q + i being head kvh * group + g's query row i
 * (the mask's rows repeated for each), so a CTA's rows cover the group and
 * every K/V tile is read once for it, not once per query head. The view
 * needs the query heads of a group equally spaced in rows: q and o heads
 * seq_q rows apart (BHSD), or one query row. The outputs (O, the
 * log-sum-exp) land where the problem's own would. Not with ALiBi (a
 * slope per query head) or a bias tensor (rows per query head). 1 with
 * *pd and *pm (the caller frees it) set; 0 when d is not such a problem;
 * -1 when out of memory (recorded). */
#define GQA_ROWS_MAX 128
static int gqa_rows_view(stof_context *ctx, const stof_attention_desc *d,
                         const stof_mask *m, stof_attention_desc *pd,
                         stof_mask **pm)
{
    stof_attention_desc nd = *d;
    stof__attention_normalise(&nd);
    const int group = stof__kv_group(&nd);
    if (group < 2 || nd.alibi_slopes || nd.bias ||
        (int64_t)group * nd.seq_q > GQA_ROWS_MAX)
        return 0;
    if (nd.seq_q > 1 && (nd.q_stride[1] != nd.seq_q * nd.q_stride[2] ||
                         nd.o_stride[1] != nd.seq_q * nd.o_stride[2]))
        return 0;
    if (stof__mask_alloc(ctx, group * nd.seq_q, nd.seq_k, pm) != STOF_OK)
        return -1;
    const size_t row = (size_t)m->words_per_row * 8u;
    for (int g = 0; g < group; g++)
        memcpy((*pm)->bits + (size_t)g * nd.seq_q * m->words_per_row, m->bits,
               row * (size_t)nd.seq_q);
    stof__mask_recount(*pm);
    *pd = nd;
    pd->layout = STOF_LAYOUT_STRIDED;
    pd->heads = nd.kv_heads;
    pd->kv_heads = 0;
    pd->seq_q = group * nd.seq_q;
    for (int t = 0; t < 2; t++) {
        int64_t *st = t ? pd->o_stride : pd->q_stride;
        const int64_t head = st[1];
        st[1] = head * group;
        st[2] = nd.seq_q > 1 ? st[2] : head;
    }
    return 1;
}

/* A new plan st (*out) after its uploads have landed (stof__plan_settle);
 * freed, with the failure, when waiting fails. */
static stof_status settled(stof_context *ctx, stof_status st, stof_plan **out)
{
    if (st != STOF_OK || !*out)
        return st;
    if ((st = stof__plan_settle(ctx)) != STOF_OK)
        stof_plan_free(out);
    return st;
}

stof_status stof_attention_plan(stof_context *ctx,
                                const stof_attention_desc *d,
                                const stof_mask *m, stof_plan **out)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    if (out)
        *out = NULL;
    STOF_CHECK_ARG(ctx, m, "mask is NULL");
    stof_attn_problem pr = {.m = m};
    float scale;
    stof_status st = stof__attention_check_desc(ctx, d, m, &scale);
    if (st != STOF_OK)
        return st;
    stof_attention_desc vd;
    stof_mask *vm = NULL;
    const int view = gqa_rows_view(ctx, d, m, &vd, &vm);
    if (view < 0)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    if (!view) {
        st = stof__attention_plan_problem(ctx, d, &pr, NULL, 0, out);
    } else {
        pr.m = vm;
        st = stof__attention_plan_problem(ctx, &vd, &pr, NULL, 0, out);
        if (st == STOF_OK)
            (*out)->gqa_rows = stof__kv_group(d);
        stof_mask_free(&vm);
    }
    return settled(ctx, st, out);
}

stof_status stof__attention_plan_problem(stof_context *ctx,
                                         const stof_attention_desc *d,
                                         const stof_attn_problem *pr,
                                         const char *key, unsigned kinds,
                                         stof_plan **out)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, out, "plan (the output pointer) is NULL");
    *out = NULL;
    miss x = {.pr = *pr};
    const double t0 = stof__now_ms();
    stof_status st = plan_begin(ctx, d, pr, key, &x.nd, x.mask_hex, x.key);
    if (st != STOF_OK)
        return st;
    const double key_ms = stof__now_ms() - t0;
    const int unchecked = ctx->records_unchecked;
    if ((*out = plan_from_db(ctx, &x.nd, pr, x.key))) {
        const stof_plan *p = *out;
        (*out)->key_ms += key_ms;
        stof__log(ctx, STOF_LOG_DEBUG,
                  "attention plan %s from the database in %.3f ms: key %.3f, "
                  "lookup %.3f, formats %.3f, load %.3f, verify %.3f ms",
                  p->key, stof__now_ms() - t0, p->key_ms, p->lookup_ms,
                  p->formats_ms, p->load_ms, p->verify_ms);
        return stof__ok(ctx);
    }
    if (ctx->settings.tuning_mode == STOF_TUNE_CACHE_ONLY ||
        ctx->records_unchecked != unchecked) {
        st = plan_fallback(ctx, d, &x.nd, pr, x.mask_hex, x.key,
                           ctx->records_unchecked == unchecked, out);
        if (st == STOF_OK)
            (*out)->key_ms += key_ms;
        return st;
    }
    stof_search_op op;
    st = miss_prepare(ctx, &x, kinds, &op);
    if (st == STOF_ERR_UNSUPPORTED && !pr->m) {
        miss_free(&x);
        return stof__fail(ctx, st,
                          "no block-format kernel supports head_dim %d on "
                          "this device",
                          d->head_dim);
    }
    if (st == STOF_ERR_UNSUPPORTED) { /* no fast kernel: the reference */
        miss_free(&x);
        return stof__attention_plan_kernel(ctx, d, pr->m, NULL, out);
    }
    stof_search_result res;
    stof_search_opts o = search_opts(ctx);
    if (st == STOF_OK)
        st = stof__search_run(ctx, &op, 1, &o, &res);
    if (st == STOF_OK)
        st = plan_tuned(ctx, &x.nd, pr, x.mask_hex, x.key,
                        &x.ranked[res.winner], &res, SEARCH_SEED, out);
    else if (x.op)
        stof__search_results_free(&res, 1);
    miss_free(&x);
    if (st == STOF_OK)
        (*out)->key_ms += key_ms;
    return st == STOF_OK ? stof__ok(ctx) : st;
}

stof_status stof_attention_plan_batch(stof_context *ctx, int n,
                                      const stof_attention_desc *descs,
                                      const stof_mask *const *masks,
                                      stof_plan **plans)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARGUMENT;
    STOF_CHECK_ARG(ctx, n >= 0, "n: %d is negative", n);
    STOF_CHECK_ARG(ctx, n == 0 || (descs && masks && plans),
                   "descs, masks and plans must not be NULL");
    for (int i = 0; i < n; i++)
        plans[i] = NULL;
    stof_status first = STOF_OK;
    char first_msg[1024] = "";
#define BATCH_FAIL(i, st)                                                      \
    do {                                                                       \
        if (first == STOF_OK) {                                                \
            first = (st);                                                      \
            snprintf(first_msg, sizeof(first_msg), "problem %d: %s", (i),      \
                     stof_errmsg(ctx));                                        \
        }                                                                      \
    } while (0)

    miss *ms = calloc((size_t)(n > 0 ? n : 1), sizeof(*ms));
    stof_search_op *ops = calloc((size_t)(n > 0 ? n : 1), sizeof(*ops));
    stof_search_result *res = calloc((size_t)(n > 0 ? n : 1), sizeof(*res));
    if (!ms || !ops || !res) {
        free(ms);
        free(ops);
        free(res);
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    }
    /* Grouped-query problems with short queries as their row views
     * (gqa_rows_view), as stof_attention_plan plans them. */
    stof_attention_desc *vd = calloc((size_t)(n > 0 ? n : 1), sizeof(*vd));
    stof_mask **vm = calloc((size_t)(n > 0 ? n : 1), sizeof(*vm));
    if (!vd || !vm) {
        free(vd);
        free(vm);
        free(ms);
        free(ops);
        free(res);
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
    }
    /* Lookups, fallbacks, and the operations of the misses. */
    int n_miss = 0;
    for (int i = 0; i < n; i++) {
        miss *x = &ms[n_miss];
        x->i = i;
        x->pr.m = masks[i];
        float scale;
        stof_status st =
            masks[i] ? stof__attention_check_desc(ctx, &descs[i], masks[i],
                                                  &scale)
                     : stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                                  "mask is NULL");
        const stof_attention_desc *di = &descs[i];
        if (st == STOF_OK) {
            const int view =
                gqa_rows_view(ctx, &descs[i], masks[i], &vd[i], &vm[i]);
            if (view < 0)
                st = stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY, "out of memory");
            else if (view) {
                di = &vd[i];
                x->pr.m = vm[i];
            }
        }
        if (st == STOF_OK)
            st = plan_begin(ctx, di, &x->pr, NULL, &x->nd, x->mask_hex,
                            x->key);
        const int unchecked = ctx->records_unchecked;
        if (st == STOF_OK &&
            (plans[i] = plan_from_db(ctx, &x->nd, &x->pr, x->key)))
            continue;
        if (st == STOF_OK &&
            (ctx->settings.tuning_mode == STOF_TUNE_CACHE_ONLY ||
             ctx->records_unchecked != unchecked))
            st = plan_fallback(ctx, di, &x->nd, &x->pr, x->mask_hex,
                               x->key, ctx->records_unchecked == unchecked,
                               &plans[i]);
        else if (st == STOF_OK) {
            st = miss_prepare(ctx, x, 0, &ops[n_miss]);
            if (st == STOF_OK) {
                n_miss++;
                continue;
            }
            miss_free(x);
            if (st == STOF_ERR_UNSUPPORTED)
                st = stof__attention_plan_kernel(ctx, di, x->pr.m, NULL,
                                                 &plans[i]);
        }
        if (st != STOF_OK)
            BATCH_FAIL(i, st);
    }
    /* Every miss in one search: each distinct kernel compiled once. */
    if (n_miss > 0) {
        stof__log(ctx, STOF_LOG_INFO, "batch warm-up: %d problems to tune",
                  n_miss);
        stof_search_opts o = search_opts(ctx);
        (void)stof__search_run(ctx, ops, n_miss, &o, res);
    }
    for (int k = 0; k < n_miss; k++) {
        miss *x = &ms[k];
        stof_status st =
            res[k].winner < 0
                ? stof__fail(ctx, STOF_ERR_VERIFY,
                             "no candidate passed verification and timing "
                             "(%d failed, %d rejected)",
                             res[k].n_failed, res[k].n_rejected)
                : plan_tuned(ctx, &x->nd, &x->pr, x->mask_hex, x->key,
                             &x->ranked[res[k].winner], &res[k], SEARCH_SEED,
                             &plans[x->i]);
        if (st != STOF_OK)
            BATCH_FAIL(x->i, st);
        stof__search_results_free(&res[k], 1);
        miss_free(x);
    }
    for (int i = 0; i < n; i++) {
        if (vm[i] && plans[i])
            plans[i]->gqa_rows = stof__kv_group(&descs[i]);
        stof_mask_free(&vm[i]);
    }
    free(vd);
    free(vm);
    free(ms);
    free(ops);
    free(res);
#undef BATCH_FAIL
    int made = 0;
    for (int i = 0; i < n; i++)
        made |= plans[i] != NULL;
    if (made) {
        stof_status st = stof__plan_settle(ctx);
        if (st != STOF_OK) {
            for (int i = 0; i < n; i++)
                stof_plan_free(&plans[i]);
            return st;
        }
    }
    if (first != STOF_OK)
        return stof__fail(ctx, first, "%s", first_msg);
    return stof__ok(ctx);
}
