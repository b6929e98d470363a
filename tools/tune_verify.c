/*
 * tune_verify.c - `stof-tune verify`: for every record made for this GPU,
 * driver, NVRTC and build, plan its problem from the database alone (the
 * database is the only, read-only, layer and the context never tunes), so
 * the stored cubin is what gets loaded; run it on random inputs and compare
 * head 0 of batch 0 with the C reference; plan each layer (its scheme
 * record) likewise, the library checking every kernel record it loads
 * against the C reference on sampled rows. A record that passes is marked
 * trusted in the user database (db.h, "Local trust"): this host has
 * checked it, so programs here use it without checking it again. The
 * plan descriptions are read, and the --json report is written, with
 * jansson.
 */
#include "tune_verify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_shim.h"
#include "db.h"
#include "db_tools.h"
#include "internal.h"
#include "layer_int.h"
#include "record_check.h"
#include "tune_cli.h"
#include "tune_text.h"

/* Complete record r's problem d (its mask's digest hex) as the library
 * keyed it: as recorded, or with grouped K/V heads (the key names
 * kv_heads, the record's fields do not): 1 with d->kv_heads set when a
 * key matches r's. 0 otherwise, with the reason in why and *skip = 1 for
 * problems the fields cannot describe (score modifiers, whose values are
 * launch data; a negative scale): the library checks those on first use.
 * A key that matches none of these is a bad record (*skip = 0). */
static int tv_rebuild(stof_context *ctx, const stof_db_record *r,
                      stof_attention_desc *d, const char *hex, int *skip,
                      char *why, size_t wn)
{
    static const char *const mkey[] = {"mods"};
    int mods = 0;
    *skip = 0;
    if (strstr(r->config, "\"mods\"") &&
        stof__json_ints(r->config, mkey, 1, &mods) && mods) {
        *skip = 1;
        snprintf(why, wn, "score modifiers (soft-cap, ALiBi, bias) are "
                          "not in the record's fields: checked by the "
                          "library on first use instead");
        return 0;
    }
    char key[33];
    for (int kvh = 0; kvh < d->heads; kvh++) { /* 0: as recorded */
        if (kvh > 0 && d->heads % kvh)
            continue;
        stof_attention_desc t = *d;
        t.kv_heads = kvh;
        stof__attention_key(ctx, &t, hex, key, NULL, 0);
        if (!strcmp(key, r->key)) {
            d->kv_heads = kvh;
            return 1;
        }
    }
    stof_attention_desc t = *d;
    t.scale = -1.0f;
    stof__attention_key(ctx, &t, hex, key, NULL, 0);
    if (!strcmp(key, r->key)) {
        *skip = 1;
        snprintf(why, wn, "a negative scale (its value is not in the "
                          "record's fields): checked by the library on "
                          "first use instead");
        return 0;
    }
    snprintf(why, wn, "the record's key matches no problem its fields "
                      "describe");
    return 0;
}

/* Run plan on random inputs and compare batch 0, head 0 with the C
 * reference: the relative error, or with why set -1 (the kernel failed)
 * or -2 (this host's trouble: memory, the reference). */
static double tv_check(stof_context *ctx, stof_plan *plan,
                       const stof_attention_desc *d, const stof_mask *m,
                       char *why, size_t wn)
{
    const stof_api *api = stof__api();
    size_t nq = (size_t)d->batch * d->heads * d->seq_q * d->head_dim;
    size_t nk = (size_t)d->batch * d->heads * d->seq_k * d->head_dim;
    uint16_t *hq = malloc(2 * nq), *hk = malloc(2 * nk), *hv = malloc(2 * nk),
             *ho = malloc(2 * nq);
    size_t rq = (size_t)d->seq_q * d->head_dim, rk = (size_t)d->seq_k * d->head_dim;
    float *f = malloc(sizeof(float) * (2 * rq + 2 * rk));
    double result = -1;
    CUdeviceptr dq = 0, dk = 0, dv = 0, dout = 0;
    int pushed = 0;
    if (!hq || !hk || !hv || !ho || !f) {
        snprintf(why, wn, "out of host memory");
        result = -2;
        goto out;
    }
    uint64_t s = 0x5eedf00dull;
    for (size_t i = 0; i < nq + 2 * nk; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float x = (float)((double)(s >> 40) / 16777216.0 * 2.0 - 1.0);
        uint16_t h = stof__f32_to_half(x, d->dtype);
        if (i < nq)
            hq[i] = h;
        else if (i < nq + nk)
            hk[i - nq] = h;
        else
            hv[i - nq - nk] = h;
    }
    if (stof__ctx_push(ctx) != STOF_OK) {
        snprintf(why, wn, "%s", stof_errmsg(ctx));
        result = -2;
        goto out;
    }
    pushed = 1;
    if (api->cuMemAlloc(&dq, 2 * nq) || api->cuMemAlloc(&dk, 2 * nk) ||
        api->cuMemAlloc(&dv, 2 * nk) || api->cuMemAlloc(&dout, 2 * nq) ||
        api->cuMemcpyHtoD(dq, hq, 2 * nq) || api->cuMemcpyHtoD(dk, hk, 2 * nk) ||
        api->cuMemcpyHtoD(dv, hv, 2 * nk) ||
        api->cuMemsetD8(dout, 0xff, 2 * nq)) {
        snprintf(why, wn, "device memory setup failed");
        result = -2;
        goto out;
    }
    if (stof_attention_run(plan, (void *)(uintptr_t)dq, (void *)(uintptr_t)dk,
                           (void *)(uintptr_t)dv, (void *)(uintptr_t)dout,
                           NULL) != STOF_OK ||
        api->cuCtxSynchronize() != CUDA_SUCCESS ||
        api->cuMemcpyDtoH(ho, dout, 2 * nq) != CUDA_SUCCESS) {
        snprintf(why, wn, "run failed: %s", stof_plan_errmsg(plan));
        goto out;
    }
    /* Batch 0, head 0: element (s, c) sits at s * seq_stride + c. */
    size_t sq_stride = (size_t)(d->layout == STOF_LAYOUT_BSHD ? d->heads : 1) *
                       (size_t)d->head_dim;
    float *q = f, *k = f + rq, *v = f + rq + rk, *o = f + rq + 2 * rk;
    for (int r = 0; r < d->seq_q; r++)
        for (int c = 0; c < d->head_dim; c++)
            q[(size_t)r * d->head_dim + c] =
                stof__half_to_f32(hq[(size_t)r * sq_stride + c], d->dtype);
    for (int r = 0; r < d->seq_k; r++)
        for (int c = 0; c < d->head_dim; c++) {
            k[(size_t)r * d->head_dim + c] =
                stof__half_to_f32(hk[(size_t)r * sq_stride + c], d->dtype);
            v[(size_t)r * d->head_dim + c] =
                stof__half_to_f32(hv[(size_t)r * sq_stride + c], d->dtype);
        }
    stof_attention_desc one;
    stof_attention_desc_init(&one, 1, 1, d->seq_q, d->seq_k, d->head_dim,
                             d->dtype, STOF_LAYOUT_BHSD);
    one.scale = d->scale;
    if (stof__ref_attention(&one, m, q, k, v, o) != STOF_OK) {
        snprintf(why, wn, "the reference failed");
        result = -2;
        goto out;
    }
    double num = 0, den = 0;
    for (int r = 0; r < d->seq_q; r++)
        for (int c = 0; c < d->head_dim; c++) {
            double g = stof__half_to_f32(ho[(size_t)r * sq_stride + c], d->dtype);
            double w = o[(size_t)r * d->head_dim + c];
            if (!isfinite(g))
                num = INFINITY;
            num += (g - w) * (g - w);
            den += w * w;
        }
    result = den > 0 ? sqrt(num / den) : sqrt(num);
out:
    if (dq)
        api->cuMemFree(dq);
    if (dk)
        api->cuMemFree(dk);
    if (dv)
        api->cuMemFree(dv);
    if (dout)
        api->cuMemFree(dout);
    if (pushed)
        stof__ctx_pop(ctx);
    free(hq);
    free(hk);
    free(hv);
    free(ho);
    free(f);
    return result;
}

/* Was the record made for the device and build of ctx? */
static int tv_matches(const stof_context *ctx, const stof_db_record *r)
{
    stof_db_record env;
    memset(&env, 0, sizeof(env));
    stof__record_env(ctx, &env);
    return stof__record_same_build(r, &env);
}

/* Whether spec names a mask family (one that stof_mask_from_spec refuses,
 * since its masks need per-batch data, still parses as a family). */
static int tv_is_family(stof_context *ctx, const char *spec)
{
    stof_mask_family *fam = NULL;
    const int ok = stof_mask_family_create(ctx, spec, &fam) == STOF_OK;
    stof_mask_family_free(&fam);
    return ok;
}

/* Whether l holds a family's attention record with this key (a family's
 * records name their own key where a mask's digest would be). */
static int tv_family_attention(const stof_dbt_records *l, const char *key)
{
    for (int j = 0; j < l->n; j++)
        if (!strcmp(l->v[j].op, "attention") && !strcmp(l->v[j].key, key) &&
            !strcmp(l->v[j].mask_digest, key))
            return 1;
    return 0;
}

/* Record r's mask (*m) when its spec gives its digest: 1. Otherwise 0 with
 * the verdict: skipped (no spec, a family's record, no memory for the
 * mask here) or bad. */
static int tv_mask(stof_context *ctx, const stof_dbt_records *l,
                   const stof_db_record *r, int seq_q, int seq_k,
                   stof_mask **m, const char **verdict, char *why, size_t wn)
{
    const int layer = !strcmp(r->op, "layer");
    *m = NULL;
    /* (*verdict is set only where the mask is not rebuilt) */
    if (!r->mask_spec[0]) {
        *verdict = "skipped";
        snprintf(why, wn, "no mask spec: the mask cannot be rebuilt");
        return 0;
    }
    /* A family's attention record names its own key as its mask; a layer
     * over a family names its attention's. */
    if (!strcmp(r->mask_digest, r->key) ||
        (layer && tv_family_attention(l, r->mask_digest))) {
        *verdict = "skipped";
        snprintf(why, wn, "made over the mask family '%s' (keyed by its "
                          "sample's statistics): checked by the library on "
                          "first use instead", r->mask_spec);
        return 0;
    }
    const stof_status st =
        stof_mask_from_spec(ctx, r->mask_spec, seq_q, seq_k, m);
    if (st == STOF_OK) {
        char hex[33];
        stof_mask_digest(*m, NULL, hex);
        if (!strcmp(hex, r->mask_digest))
            return 1;
        stof_mask_free(m);
        if (layer && tv_is_family(ctx, r->mask_spec)) {
            *verdict = "skipped";
            /* (a layer over a family whose attention record is elsewhere
             * looks the same: never looked up by another key, harmless) */
            snprintf(why, wn, "its mask digest is not that of '%s': a "
                              "layer over that mask family (its attention "
                              "record is not here) or a damaged record; "
                              "checked by the library on first use instead",
                     r->mask_spec);
            return 0;
        }
        *verdict = "bad";
        snprintf(why, wn, "mask spec '%s' does not give the recorded digest",
                 r->mask_spec);
        return 0;
    }
    char msg[400];
    snprintf(msg, sizeof(msg), "%s", stof_errmsg(ctx));
    if (st == STOF_ERR_OUT_OF_MEMORY) {
        *verdict = "skipped";
        snprintf(why, wn, "cannot build the mask here: %s", msg);
        return 0;
    }
    if (tv_is_family(ctx, r->mask_spec)) {
        *verdict = "skipped";
        snprintf(why, wn, "made over the mask family '%s' (its masks need "
                          "per-batch data): checked by the library on "
                          "first use instead", r->mask_spec);
        return 0;
    }
    *verdict = "bad";
    snprintf(why, wn, "cannot rebuild the mask: %s", msg);
    return 0;
}

/* An attention record: plan its problem from the database under test, run
 * it and compare with the C reference. The verdict; why and *rel set. */
static const char *tv_attention(stof_context *ctx, const stof_dbt_records *l,
                                const stof_db_record *r, double *rel,
                                char *why, size_t wn)
{
    const char *verdict = "ok";
    stof_attention_desc d;
    stof_mask *m = NULL;
    stof_plan *plan = NULL;
    char hex[33];
    int skip = 0;
    stof_status st;
    if (!tv_mask(ctx, l, r, r->seq_q, r->seq_k, &m, &verdict, why, wn))
        return verdict;
    /* (the library counts the records it could not load or check for
     * want of memory: not theirs to answer for) */
    const int unchecked = ctx->records_unchecked;
    stof_mask_digest(m, NULL, hex);
    if (stof_attention_desc_init(&d, r->batch, r->heads, r->seq_q, r->seq_k,
                                 r->head_dim,
                                 strcmp(r->dtype, "bf16") ? STOF_DTYPE_FP16
                                                          : STOF_DTYPE_BF16,
                                 STOF_LAYOUT_BHSD) != STOF_OK) {
        verdict = "bad";
        snprintf(why, wn, "cannot rebuild the problem: %s", stof_errmsg(ctx));
    } else if (!tv_rebuild(ctx, r, &d, hex, &skip, why, wn)) {
        verdict = skip ? "skipped" : "bad";
    } else if ((st = stof_attention_plan(ctx, &d, m, &plan)) != STOF_OK &&
               ctx->records_unchecked != unchecked) {
        /* (its check could not run here: not the record's fault) */
        verdict = "skipped";
        snprintf(why, wn, "this host could not load or check it (not the "
                          "record's fault): %.400s",
                 ctx->unchecked_why);
    } else if (st != STOF_OK) {
        /* (no memory here is not the record's fault) */
        verdict = st == STOF_ERR_OUT_OF_MEMORY ? "skipped" : "bad";
        snprintf(why, wn, "plan failed: %s", stof_errmsg(ctx));
    } else {
        /* The plan must have loaded this very record from the database
         * under test, not tuned or fallen back. */
        json_t *desc = plan_description(plan);
        const char *src = json_string_value(json_object_get(desc, "source"));
        const char *key = json_string_value(json_object_get(desc, "key"));
        const int stored = src && key && !strcmp(src, "system db") &&
                           !strcmp(key, r->key);
        json_decref(desc);
        if (!stored && ctx->records_unchecked != unchecked) {
            verdict = "skipped";
            snprintf(why, wn, "this host could not load or check it (not "
                              "the record's fault): %.400s",
                     ctx->unchecked_why);
        } else if (!stored) {
            verdict = "bad";
            snprintf(why, wn, "the stored kernel was not used: it did not "
                              "load or failed its check on this GPU");
        } else {
            *rel = tv_check(ctx, plan, &d, m, why, wn);
            double tol = d.dtype == STOF_DTYPE_BF16 ? 2e-2 : 1e-2;
            if (*rel < -1.5) {
                verdict = "skipped"; /* not the record's fault */
                *rel = -1;
            } else if (*rel < 0)
                verdict = "bad";
            else if (!(*rel <= tol)) {
                verdict = "bad";
                snprintf(why, wn, "relative error %.3g exceeds %.3g", *rel,
                         tol);
            }
        }
    }
    stof_plan_free(&plan);
    stof_mask_free(&m);
    return verdict;
}

/* Verdicts of the records of a database, in the order they are decided. */
typedef struct tv_out {
    const char **verdict; /* per record; NULL: not decided yet */
    char (*why)[512];
} tv_out;

/* The undecided kernel records (force: all of them; any slot) of the
 * layer whose key text is text: verdict v and why, record bad_key (when
 * not NULL) bad with bad_why instead. */
static void tv_kernels(const stof_dbt_records *l, tv_out *o, const char *text,
                       const char *v, const char *why, const char *bad_key,
                       const char *bad_why, int force)
{
    for (int k = 0; k < G_COUNT + N_COUNT; k++) {
        char key[33];
        stof__layer_op_key_of(text,
                              k < G_COUNT ? stof__layer_g_slot[k]
                                          : stof__layer_n_slot[k - G_COUNT],
                              key);
        for (int j = 0; j < l->n; j++) {
            if ((o->verdict[j] && !force) || strcmp(l->v[j].key, key))
                continue;
            const int bad = bad_key && !strcmp(key, bad_key);
            o->verdict[j] = bad ? "bad" : v;
            snprintf(o->why[j], sizeof(o->why[j]), "%s", bad ? bad_why : why);
        }
    }
}

/* The GPU faulted while layer record i was checked: one of its kernels,
 * or stof itself. The layer and all its kernel records are bad (dropped,
 * they are tuned again at their next use), whatever was decided. */
static void tv_layer_fault(stof_context *ctx, const stof_dbt_records *l,
                           int i, tv_out *o, const char *fault)
{
    const stof_db_record *r = &l->v[i];
    char text[1024], kwhy[512], why[256];
    stof_layer_desc d;
    int old = 0;
    o->verdict[i] = "bad";
    snprintf(o->why[i], sizeof(o->why[i]), "the GPU faulted while its "
             "kernels were checked: %s", fault);
    if (stof__layer_record_desc(ctx, r, &d, &old, text, sizeof(text), why,
                                sizeof(why))) {
        snprintf(kwhy, sizeof(kwhy), "the GPU faulted while its layer %.12s "
                 "was checked: %s", r->key, fault);
        tv_kernels(l, o, text, "bad", kwhy, NULL, NULL, 1);
    }
}

/* A layer's scheme record (index i): plan its layer from the database
 * under test. Nothing is trusted in this context, so the library checks
 * every stored kernel of the layer against the C reference on sampled
 * rows as it loads it (its first use); the layer's kernel records (op
 * "gemm", "norm") get their verdicts from that too. When the GPU faults
 * meanwhile (the context is lost), fault is set. */
static void tv_layer(stof_context *ctx, const stof_dbt_records *l, int i,
                     tv_out *o, char *fault, size_t fn)
{
    const stof_db_record *r = &l->v[i];
    char *why = o->why[i];
    const size_t wn = sizeof(o->why[i]);
    char kwhy[512], text[1024];
    stof_layer_desc d;
    int old = 0;
    stof_mask *m = NULL;
    stof_layer *L = NULL;
    o->verdict[i] = "bad";
    if (l->why[i][0]) {
        snprintf(why, wn, "invalid record: %s", l->why[i]);
        return;
    }
    const int found = stof__layer_record_desc(ctx, r, &d, &old, text,
                                              sizeof(text), why, wn);
    if (!found) {
        if (old) {
            o->verdict[i] = "skipped";
            snprintf(why, wn, "the record predates the full layer "
                              "description and its key matches no usual "
                              "one: checked by the library on first use "
                              "instead");
        }
        return;
    }
    if (found == 2) {
        o->verdict[i] = "skipped";
        snprintf(why, wn, "made with another cuBLASLt version (its key "
                          "names it): used only where that one is loaded");
        snprintf(kwhy, sizeof(kwhy), "not checked: its layer %.12s was made "
                 "with another cuBLASLt version", r->key);
        tv_kernels(l, o, text, "skipped", kwhy, NULL, NULL, 0);
        return;
    }
    if (!tv_mask(ctx, l, r, d.seq, d.seq, &m, &o->verdict[i], why, wn)) {
        snprintf(kwhy, sizeof(kwhy), "not checked: its layer %.12s: %s",
                 r->key, why);
        tv_kernels(l, o, text, "skipped", kwhy, NULL, NULL, 0);
        return;
    }
    if (stof_layer_plan(ctx, &d, m, &L) != STOF_OK) {
        char msg[400];
        snprintf(msg, sizeof(msg), "%s", stof_errmsg(ctx));
        if (!gpu_alive(ctx, fault, fn)) {
            tv_layer_fault(ctx, l, i, o, fault);
        } else {
            o->verdict[i] = "skipped";
            snprintf(why, wn, "could not be planned here: %s", msg);
            snprintf(kwhy, sizeof(kwhy), "not checked: its layer %.12s could "
                     "not be planned here", r->key);
            tv_kernels(l, o, text, "skipped", kwhy, NULL, NULL, 0);
        }
        stof_mask_free(&m);
        return;
    }
    if (!strcmp(L->source, "database") && !strcmp(L->key, r->key)) {
        /* Its scheme's kernels were loaded and checked. */
        int n = 0;
        for (int s = 0; s < L->n_steps; s++) {
            const step *st = &L->steps[s];
            if (st->kind == STEP_ATTN)
                continue;
            char key[33];
            stof__layer_op_key(L, st->kind == STEP_GEMM
                                      ? stof__layer_g_slot[st->op]
                                      : stof__layer_n_slot[st->op],
                               key);
            for (int j = 0; j < l->n; j++) {
                if (o->verdict[j] || strcmp(l->v[j].key, key))
                    continue;
                n++;
                o->verdict[j] = l->why[j][0] ? "bad" : "ok";
                if (l->why[j][0])
                    snprintf(o->why[j], sizeof(o->why[j]),
                             "invalid record: %s", l->why[j]);
                else
                    snprintf(o->why[j], sizeof(o->why[j]),
                             "checked with its layer %.12s", r->key);
            }
        }
        o->verdict[i] = "ok";
        snprintf(why, wn, "%d kernel record(s) checked against the C "
                          "reference", n);
    } else if (L->db_transient) {
        o->verdict[i] = "skipped";
        snprintf(why, wn, "could not be checked here: %s", L->db_why);
        snprintf(kwhy, sizeof(kwhy), "not checked: its layer %.12s could "
                 "not be checked here", r->key);
        tv_kernels(l, o, text, "skipped", kwhy, NULL, NULL, 0);
    } else {
        snprintf(why, wn, "not planned from its records: %s",
                 L->db_why[0] ? L->db_why : "another key");
        snprintf(kwhy, sizeof(kwhy), "not checked: its layer %.12s failed on "
                 "another record", r->key);
        tv_kernels(l, o, text, "skipped", kwhy,
                   L->db_bad_key[0] ? L->db_bad_key : NULL, L->db_why, 0);
    }
    stof_layer_free(&L);
    stof_mask_free(&m);
}

int tv_verify(stof_context *cpu, const char *path, int drop, int json,
              tv_open_gpu_fn open_gpu)
{
    stof_dbt_records l = {0};
    l.check = stof__record_check;
    const char *sys[] = {path, NULL};
    stof_db *db = NULL;
    stof_status st = stof__db_open(STOF_DB_SINK(cpu), "", sys, &db);
    if (st == STOF_OK)
        st = stof__db_foreach(db, 1, stof__dbt_collect, &l);
    stof__db_close(&db);
    if (st != STOF_OK) {
        fprintf(stderr, "stof-tune: database error: %s\n",
                tt_term(stof_errmsg(cpu)));
        stof__dbt_records_free(&l);
        return 4;
    }
    stof_db *udb = NULL;
    stof_settings s;
    stof_default_settings(&s);
    s.user_db = "";
    s.system_dbs = sys;
    s.tuning_mode = STOF_TUNE_CACHE_ONLY;
    stof_context *ctx = NULL;
    int rc = open_gpu(&s, &ctx);
    if (rc) {
        stof__dbt_records_free(&l);
        return rc;
    }
    /* Where trust is written: the user database of this host. */
    (void)stof__db_open(STOF_DB_SINK(cpu), NULL, NULL, &udb);
    /* each bad record's key and content hash (--drop deletes that
     * record, not another one stored under its key meanwhile) */
    char (*bad)[2][33] = calloc((size_t)l.n + 1, sizeof(*bad));
    tv_out o = {calloc((size_t)l.n + 1, sizeof(*o.verdict)),
                calloc((size_t)l.n + 1, sizeof(*o.why))};
    double *rel = calloc((size_t)l.n + 1, sizeof(*rel));
    int n_ok = 0, n_bad = 0, n_skip = 0, n_other = 0, n_dropped = 0;
    /* Once the GPU faulted the context is lost: nothing after that record
     * (fault_key) is checked in this run. */
    char fault[256] = "", fault_key[33] = "";
    /* With --json the verdicts are gathered and printed in one document
     * at the end (NULL once that ran out of memory). */
    json_t *verdicts = json ? json_array() : NULL;
    /* Pass 0: attention, builder and other records; pass 1: layers (a
     * layer plans its attention record, already checked, and decides its
     * kernels' records); pass 2: the kernels' records. */
    for (int pass = 0; bad && o.verdict && o.why && rel && pass < 3; pass++)
        for (int i = 0; i < l.n; i++) {
            const stof_db_record *r = &l.v[i];
            const int kernel_rec =
                !strcmp(r->op, "gemm") || !strcmp(r->op, "norm");
            if ((kernel_rec ? 2 : !strcmp(r->op, "layer") ? 1 : 0) != pass)
                continue;
            if (!tv_matches(ctx, r)) {
                n_other++;
                continue;
            }
            char *why = o.why[i];
            const size_t wn = sizeof(o.why[i]);
            rel[i] = -1;
            if (fault[0] && !o.verdict[i]) {
                o.verdict[i] = "skipped";
                snprintf(why, wn, "not checked: the GPU faulted while "
                                  "%.12s was checked (%s); run verify "
                                  "again",
                         fault_key, fault);
            } else if (!strcmp(r->op, "layer")) {
                tv_layer(ctx, &l, i, &o, fault, sizeof(fault));
                /* (a kernel that faulted in the library's check may have
                 * left a plan that needed no further GPU call) */
                if (!fault[0] && !gpu_alive(ctx, fault, sizeof(fault)))
                    tv_layer_fault(ctx, &l, i, &o, fault);
                if (fault[0])
                    snprintf(fault_key, sizeof(fault_key), "%s", r->key);
            } else if (kernel_rec) {
                if (!o.verdict[i]) {
                    o.verdict[i] = "skipped";
                    snprintf(why, wn, l.why[i][0]
                                          ? "invalid record, of no layer "
                                            "record checked here"
                                          : "not checked: no layer record "
                                            "checked here uses it");
                }
            } else if (!strcmp(r->op, "builder")) {
                o.verdict[i] = "skipped";
                snprintf(why, wn, "the GPU format builder's cubin: compiled "
                                  "on this kind of machine, used only where "
                                  "it was made");
            } else if (strcmp(r->op, "attention") != 0) {
                o.verdict[i] = "bad";
                snprintf(why, wn, "unknown op '%s'", r->op);
            } else if (l.why[i][0]) {
                o.verdict[i] = "bad";
                snprintf(why, wn, "invalid record: %s", l.why[i]);
            } else {
                o.verdict[i] = tv_attention(ctx, &l, r, &rel[i], why, wn);
                if (!gpu_alive(ctx, fault, sizeof(fault))) {
                    o.verdict[i] = "bad";
                    snprintf(why, wn, "the GPU faulted while it was "
                                      "checked: %s", fault);
                    snprintf(fault_key, sizeof(fault_key), "%s", r->key);
                }
            }
            const char *verdict = o.verdict[i];
            if (!strcmp(verdict, "ok")) {
                n_ok++;
                stof__db_trust(udb, r);
            } else if (!strcmp(verdict, "skipped")) {
                n_skip++;
            } else {
                snprintf(bad[n_bad][0], sizeof(bad[0][0]), "%s", r->key);
                snprintf(bad[n_bad++][1], sizeof(bad[0][1]), "%s",
                         r->content_hash);
            }
            if (json) {
                /* rel_err is -1 when nothing was compared, as it always
                 * was; an error that is not finite is written as null. */
                if (json_array_append_new(
                        verdicts,
                        json_pack("{s:o, s:o, s:s, s:o, s:o}", "key",
                                  tt_jstr(r->key), "op", tt_jstr(r->op),
                                  "verdict", verdict, "rel_err",
                                  tt_jnum(rel[i], 4), "why",
                                  tt_jstr(why)))) {
                    json_decref(verdicts);
                    verdicts = NULL;
                }
            } else if (!strcmp(r->op, "attention")) {
                printf("%-8s %.12s  %s %dx%dx%dx%dx%d %s  %s%s%s\n", verdict,
                       tt_term(r->key),
                       r->mask_spec[0] ? tt_term(r->mask_spec) : "(no spec)",
                       r->batch, r->heads, r->seq_q, r->seq_k, r->head_dim,
                       tt_term(r->dtype), tt_term(r->kernel),
                       why[0] ? ": " : "", tt_term(why));
            } else {
                /* layer: batch x seq, heads; gemm: M x N x K; norm:
                 * tokens x width */
                printf("%-8s %.12s  %s %s %dx%d", verdict, tt_term(r->key),
                       tt_term(r->op),
                       r->mask_spec[0] ? tt_term(r->mask_spec) : "(no spec)",
                       r->batch, r->seq_q);
                if (!strcmp(r->op, "gemm"))
                    printf("x%d", r->seq_k);
                else if (!strcmp(r->op, "layer"))
                    printf(" heads %d", r->heads);
                printf(" %s %s%s%s\n", tt_term(r->dtype), tt_term(r->kernel),
                       why[0] ? ": " : "", tt_term(why));
            }
            tt_release();
            fflush(stdout);
        }
    stof_close(&ctx);
    stof__db_close(&udb);
    int db_failed = !bad || !o.verdict || !o.why || !rel;
    if (db_failed)
        fprintf(stderr, "stof-tune: out of memory\n");
    for (int i = 0; drop && i < n_bad; i++) {
        if (stof__dbt_delete(STOF_DB_SINK(cpu), path, bad[i][0], bad[i][1]) ==
            STOF_OK)
            n_dropped++;
        else {
            fprintf(stderr, "stof-tune: database error: %s\n",
                    tt_term(stof_errmsg(cpu)));
            db_failed = 1;
            break;
        }
    }
    int print_rc = 0;
    if (json)
        print_rc = print_json(json_pack(
            "{s:o, s:o, s:i, s:i, s:i, s:i, s:i}", "database", tt_jstr(path),
            "records", verdicts, "ok", n_ok, "bad", n_bad, "skipped", n_skip,
            "other_gpu_or_build", n_other, "dropped", n_dropped));
    else
        printf("%d ok, %d bad%s, %d skipped, %d for another GPU, driver or "
               "build\n",
               n_ok, n_bad, drop ? " (dropped)" : "", n_skip, n_other);
    free(bad);
    free(o.verdict);
    free(o.why);
    free(rel);
    stof__dbt_records_free(&l);
    if (db_failed)
        return 4;
    return n_bad > n_dropped ? 1 : print_rc;
}
