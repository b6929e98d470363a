/*
 * layer_db.c - a Transformer layer and the tuning database: its keys
 * (everything that decides the winners), loading its kernels (template
 * cubins and cuBLASLt algorithms) from records, each verified on this GPU
 * at its first use, and storing what tuning chose: one record per kernel
 * (op "gemm" or "norm") and one for the layer (op "layer", the scheme).
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "layer_int.h"
#include "cfmt.h"
#include "record_check.h"

#include <jansson.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define g_slot stof__layer_g_slot
#define n_slot stof__layer_n_slot

/* A layer's (or its kernel's) key: the 128-bit XXH3 of its key text, in
 * hex. */
void stof__layer_key_hash(const char *text, char key[33])
{
    XXH128_hash_t h = XXH3_128bits(text, strlen(text));
    snprintf(key, 33, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
}

/* Everything that decides the winners: the layer d (its norm's eps), the
 * mask, the device, the versions (cuBLASLt's too, lt: its algorithms are
 * stored). */
static void key_text(const stof_device *dev, const stof_layer_desc *d,
                     float eps, size_t lt, const char *mask_hex, char *out,
                     size_t n)
{
    stof__c_snprintf(out, n, /* (eps in the C locale's hex form) */
             "op=layer;v=1;mask=%s;batch=%d;seq=%d;hidden=%d;heads=%d;"
             "ffn=%d;dtype=%s;act=%d;norm=%d;pre=%d;eps=%a;device=%s;"
             "cc=%d.%d;sms=%d;driver=%d;nvrtc=%d.%d;stof=%s;"
             "templates=%016llx;cublaslt=%zu",
             mask_hex, d->batch, d->seq, d->hidden, d->heads, d->ffn,
             stof__layer_dtype_str(d->dtype), (int)d->act, (int)d->norm,
             d->pre_norm, (double)eps, dev->name, dev->cc_major,
             dev->cc_minor, dev->sm_count, dev->driver_version,
             dev->nvrtc_major, dev->nvrtc_minor, stof_version_string(),
             (unsigned long long)stof_template_hash(), lt);
    /* Grouped-query, bias-free and gated layers only (the others' keys
     * are unchanged). */
    size_t k = strlen(out);
    if (d->kv_heads > 0 && d->kv_heads != d->heads && k < n)
        k += (size_t)snprintf(out + k, n - k, ";kv_heads=%d", d->kv_heads);
    if (d->no_bias && k < n)
        k += (size_t)snprintf(out + k, n - k, ";no_bias=1");
    if (d->gated && k < n)
        k += (size_t)snprintf(out + k, n - k, ";gated=1");
    if (d->qk_norm && k < n)
        k += (size_t)snprintf(out + k, n - k, ";qk_norm=1");
    /* (heads whose width is not hidden's: Qwen3 0.6B and 4B) */
    if (stof__layer_qd(d) != d->hidden && k < n)
        k += (size_t)snprintf(out + k, n - k, ";head_dim=%d",
                              stof__layer_hd(d));
    /* (theta in the C locale's hex form; a layer with its own frequencies:
     * "table", whatever they and the scale are, as a scheme does not
     * depend on them) */
    if (d->rope_freq && k < n)
        snprintf(out + k, n - k, ";rope=table;rope_dim=%d", d->rope_dim);
    else if (d->rope_theta != 0.0f && k < n)
        stof__c_snprintf(out + k, n - k, ";rope=%a;rope_dim=%d",
                         (double)d->rope_theta, d->rope_dim);
}

void stof__layer_key(stof_layer *L, const char *mask_hex)
{
    key_text(&L->ctx->device, &L->d, L->eps, stof__blaslt_version(),
             mask_hex, L->key_text, sizeof(L->key_text));
    stof__layer_key_hash(L->key_text, L->key);
}

void stof__layer_op_key_of(const char *layer_key_text, const char *slot,
                           char key[33])
{
    char text[1100];
    snprintf(text, sizeof(text), "%s;slot=%s", layer_key_text, slot);
    stof__layer_key_hash(text, key);
}

void stof__layer_op_key(const stof_layer *L, const char *slot, char key[33])
{
    stof__layer_op_key_of(L->key_text, slot, key);
}

/* --- loading kernels -------------------------------------------------------- */

/* Whether a stored template kernel's epilogue e is the one op g runs with
 * configuration c (a gated op's split kernel has the wide GEMM's). */
static int epi_matches(const gemm_op *g, const stof_gemm_cfg *c,
                       const stof_gemm_epi *e)
{
    const stof_gemm_epi k = stof__layer_kernel_epi(g, 0, c);
    return memcmp(&k, e, sizeof(k)) == 0;
}

void stof__layer_gemm_unload(stof_layer *L, gemm_op *g)
{
    stof__module_release(L->ctx, g->mod);
    stof__blaslt_free(&g->ltg);
    g->mod = NULL;
    g->fn = NULL;
    g->ok = 0;
}

void stof__layer_norm_unload(stof_layer *L, norm_op *n)
{
    stof__module_release(L->ctx, n->mod);
    n->mod = NULL;
    n->fn = NULL;
    n->ok = 0;
}

stof_status stof__layer_gemm_load_template(stof_layer *L, gemm_op *g,
                                           const stof_gemm_cfg *c,
                                           const void *cubin, size_t size,
                                           uint64_t hash)
{
    stof__layer_gemm_unload(L, g);
    const stof_gemm_epi e = stof__layer_kernel_epi(g, 0, c);
    stof_status st = stof__gemm_load_cubin_shared(
        L->ctx, c, &e, g->N, cubin, size, hash, &g->mod, &g->fn);
    if (st == STOF_OK) {
        g->cfg = *c;
        g->lt = 0;
        g->ok = 1;
    }
    return st;
}

stof_status stof__layer_gemm_load_lt(stof_layer *L, gemm_op *g,
                                     const void *algo)
{
    stof__layer_gemm_unload(L, g);
    /* A gated op runs split: cuBLASLt makes the 2 ffn-wide product. */
    const int wn = g->epi.gated ? 2 * g->N : g->N;
    const stof_gemm_epi e = stof__layer_kernel_epi(g, 1, NULL);
    stof_status st = stof__blaslt_create(L->ctx, L->d.dtype, g->M, wn, g->K,
                                         g->K, g->K, wn, &e, 0, &g->ltg);
    if (st == STOF_OK)
        st = stof__blaslt_set_algo(L->ctx, g->ltg, algo);
    if (st == STOF_OK) {
        g->lt = 1;
        g->ok = 1;
    } else {
        stof__blaslt_free(&g->ltg);
    }
    return st;
}

stof_status stof__layer_norm_load(stof_layer *L, norm_op *n, int warps,
                                  const void *cubin, size_t size,
                                  uint64_t hash)
{
    stof__layer_norm_unload(L, n);
    stof_status st = (stof_status)stof__module_load_shared_hashed(
        L->ctx, cubin, size, hash, "stof_norm", 0, &n->mod, &n->fn);
    if (st == STOF_OK) {
        n->warps = warps;
        n->ok = 1;
    }
    return st;
}

void stof__layer_unload_unused(stof_layer *L)
{
    int used_g[G_COUNT] = {0}, used_n[N_COUNT] = {0};
    for (int i = 0; i < L->n_steps; i++) {
        if (L->steps[i].kind == STEP_GEMM)
            used_g[L->steps[i].op] = 1;
        else if (L->steps[i].kind == STEP_NORM)
            used_n[L->steps[i].op] = 1;
    }
    for (int i = 0; i < G_COUNT; i++)
        if (!used_g[i])
            stof__layer_gemm_unload(L, &L->g[i]);
    for (int i = 0; i < N_COUNT; i++)
        if (!used_n[i])
            stof__layer_norm_unload(L, &L->n[i]);
}

/* --- the database ------------------------------------------------------------ */

static void record_base(const stof_layer *L, const char *mask_hex,
                        const char *spec, stof_db_record *r)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->mask_digest, sizeof(r->mask_digest), "%s", mask_hex);
    if (spec)
        snprintf(r->mask_spec, sizeof(r->mask_spec), "%s", spec);
    snprintf(r->dtype, sizeof(r->dtype), "%s", stof__layer_dtype_str(L->d.dtype));
    stof__record_env(L->ctx, r);
    snprintf(r->arch, sizeof(r->arch), "%s", L->ctx->device.arch);
    r->verified = 1;
}

static const char *const warps_key[] = {"warps"};
static const char *const lt_key[] = {"lt"};

/* The scheme of a layer record's configuration: 1 with both junction cuts
 * in range. */
static int scheme_of(const char *config, int *ja, int *jb)
{
    static const char *const keys[] = {"ja", "jb"};
    int v[2];
    if (!stof__json_ints(config, keys, 2, v) || v[0] < 0 || v[0] >= J_COUNT ||
        v[1] < 0 || v[1] >= J_COUNT)
        return 0;
    *ja = v[0];
    *jb = v[1];
    return 1;
}

int stof__layer_norm_record_matches(const char *config, const norm_op *n,
                                    int norm_kind, int *warps)
{
    static const char *const keys[] = {"warps", "bias", "res", "pre", "norm"};
    int v[5];
    if (!config || !stof__json_ints(config, keys, 5, v) || v[0] < 1 ||
        v[0] > 32 || v[1] != n->bias || v[2] != n->res || v[3] != n->pre ||
        v[4] != norm_kind)
        return 0;
    *warps = v[0];
    return 1;
}

int stof__layer_record_pdl(const char *config)
{
    static const char *const key[] = {"pdl"};
    int v = -1;
    if (!config || !stof__json_ints(config, key, 1, &v) || v < 0 || v > 1)
        return -1;
    return v;
}

int stof__layer_record_check(const stof_db_record *r, char *why, size_t n)
{
    if (!strcmp(r->op, "layer")) {
        int ja = -1, jb = -1;
        if (strcmp(r->kernel, "scheme") != 0 ||
            !scheme_of(r->config, &ja, &jb))
            return stof__why(why, n, "malformed layer scheme");
        return 1;
    }
    if (!strcmp(r->op, "norm")) {
        int warps = 0;
        if (strcmp(r->kernel, "norm") != 0 ||
            !stof__json_ints(r->config, warps_key, 1, &warps) || warps < 1 ||
            warps > 32)
            return stof__why(why, n, "malformed norm configuration");
        return 1;
    }
    if (strcmp(r->op, "gemm") != 0)
        return stof__why(why, n, "not a layer record");
    if (!strcmp(r->kernel, "cublaslt")) {
        int ver = 0;
        if (!stof__json_ints(r->config, lt_key, 1, &ver) ||
            r->cubin_size != STOF_BLASLT_ALGO_BYTES)
            return stof__why(why, n, "malformed cuBLASLt algorithm");
        return 1;
    }
    stof_gemm_cfg c;
    stof_gemm_epi e;
    char cw[200];
    if (strcmp(r->kernel, "gemm") != 0 ||
        !stof__gemm_cfg_parse(r->config, &c, &e))
        return stof__why(why, n, "malformed GEMM configuration");
    if (r->seq_q < 1 || r->seq_k < 1 ||
        !stof__gemm_cfg_valid(NULL, &c, &e, r->seq_q, r->seq_k, cw,
                              sizeof(cw)))
        return stof__why(why, n, "invalid GEMM configuration: %s",
                         r->seq_q < 1 || r->seq_k < 1 ? "sizes" : cw);
    return 1;
}

/* The layer a scheme record r was tuned for: its descriptor from r's
 * fields and configuration, kept only when its key over r's mask digest is
 * r's key; its key text to text (tn bytes). The cuBLASLt version is the
 * record's ("lt"; older records: this host's). Records made before the
 * configuration named kv_heads, no_bias, gated, eps and lt are matched by
 * trying the usual values of those. 1: found, made with this host's
 * cuBLASLt; 2: found, made with another cuBLASLt (this host cannot use
 * it); 0: not found, with why (*old = 1 when an old record matched none
 * of the usual values). */
int stof__layer_record_desc(stof_context *ctx, const stof_db_record *r,
                            stof_layer_desc *d, int *old, char *text,
                            size_t tn, char *why, size_t n)
{
    static const char *const keys[] = {"pre", "hidden", "ffn", "act",
                                       "norm"};
    static const char *const more[] = {"kv_heads", "no_bias", "gated"};
    static const char *const lt_key1[] = {"lt"};
    int v[5], w[3] = {0, 0, 0}, ltv = 0;
    *old = 0;
    if (strcmp(r->op, "layer") != 0 || !stof__json_ints(r->config, keys, 5, v))
        return stof__why(why, n, "not a layer scheme with its descriptor");
    if (r->heads < 1 || r->heads > 4096)
        return stof__why(why, n, "%d heads", r->heads);
    stof_layer_desc_init(d, r->batch, r->seq_q, v[1], r->heads,
                         strcmp(r->dtype, "bf16") ? STOF_DTYPE_FP16
                                                  : STOF_DTYPE_BF16);
    d->pre_norm = v[0];
    d->ffn = v[2];
    /* (heads whose width is not hidden's: the record's head_dim says) */
    if (r->head_dim > 0 && (int64_t)r->head_dim * r->heads != d->hidden) {
        if (r->head_dim < 16 || r->head_dim > 256 || r->head_dim % 8)
            return stof__why(why, n, "head_dim %d", r->head_dim);
        d->head_dim = r->head_dim;
    }
    d->act = (stof_activation)v[3];
    d->norm = (stof_norm_kind)v[4];
    double eps = 0.0;
    json_t *o = json_loads(r->config, 0, NULL);
    const int full = o && json_is_number(json_object_get(o, "eps")) &&
                     stof__json_ints(r->config, more, 3, w) &&
                     stof__json_ints(r->config, lt_key1, 1, &ltv) && ltv >= 0;
    if (full)
        eps = json_number_value(json_object_get(o, "eps"));
    /* RoPE (records of RoPE layers name it; the key decides below) */
    const json_t *jt = o ? json_object_get(o, "rope_theta") : NULL;
    const json_t *jd = o ? json_object_get(o, "rope_dim") : NULL;
    const json_t *jf = o ? json_object_get(o, "rope_table") : NULL;
    if (jt || jd || jf) {
        /* a base, or a table of its own (stand-in frequencies: the scheme
         * does not depend on them) */
        const double th = json_is_number(jt) ? json_number_value(jt) : 0.0;
        const json_int_t rd = json_is_integer(jd) ? json_integer_value(jd)
                                                  : -1;
        const int table = json_is_true(jf);
        if ((table ? jt != NULL : !(th > 1.0 && th <= FLT_MAX)) ||
            (jf && !table) || rd < 0 || rd > 256) {
            json_decref(o);
            return stof__why(why, n, "the record's rope_theta, rope_table "
                                     "or rope_dim is not a layer's");
        }
        d->rope_theta = (float)th;
        d->rope_dim = (int)rd;
        d->rope_freq = table ? stof__rope_freq_standin() : NULL;
    }
    /* A QK norm (records of such layers name it) */
    const json_t *jq = o ? json_object_get(o, "qk_norm") : NULL;
    if (jq) {
        if (!json_is_integer(jq) || json_integer_value(jq) != 1) {
            json_decref(o);
            return stof__why(why, n, "the record's qk_norm is not a layer's");
        }
        d->qk_norm = 1;
    }
    json_decref(o);
    const size_t lt = full ? (size_t)ltv : stof__blaslt_version();
    static const float eps_usual[] = {1e-5f, 1e-6f, 1e-12f, 1e-8f, 1e-7f};
    const int n_eps = full ? 1 : (int)(sizeof(eps_usual) / sizeof(*eps_usual));
    char key[33];
    for (int kvh = 0; kvh <= d->heads; kvh++) {
        /* (kv_heads = heads is keyed as 0) */
        if (full ? kvh != w[0]
                 : kvh == d->heads || (kvh > 0 && d->heads % kvh))
            continue;
        for (int f = 0; f < 4; f++) {
            if (full && f != (w[1] ? 1 : 0) + (w[2] ? 2 : 0))
                continue;
            for (int e = 0; e < n_eps; e++) {
                stof_layer_desc t = *d;
                t.kv_heads = kvh;
                t.no_bias = f & 1;
                t.gated = f >> 1;
                t.norm_eps = full ? (float)eps : eps_usual[e];
                key_text(&ctx->device, &t, t.norm_eps, lt, r->mask_digest,
                         text, tn);
                stof__layer_key_hash(text, key);
                if (!strcmp(key, r->key)) {
                    *d = t;
                    return lt == stof__blaslt_version() ? 1 : 2;
                }
            }
        }
    }
    *old = !full;
    return stof__why(why, n,
                     full ? "the record's key is not that of the layer its "
                            "fields describe"
                          : "the record's key matches none of the layers "
                            "its fields and the usual kv_heads, bias, gate "
                            "and eps values describe");
}

/* Load the scheme and its kernels stored under L's keys. STOF_OK, or
 * STOF_ERR_NOT_FOUND (a miss, or something unusable: logged). */
stof_status stof__layer_from_db(stof_layer *L)
{
    const double t_all = stof__now_ms();
    stof_db *db = stof__ctx_db(L->ctx);
    stof_db_record rec;
    L->db_bad_key[0] = '\0';
    L->db_transient = 0;
    L->db_replace = 0;
    snprintf(L->db_why, sizeof(L->db_why), "no layer record");
    if (!db || stof__db_lookup(db, L->key, &rec) != STOF_OK)
        return STOF_ERR_NOT_FOUND;
    L->db_why[0] = '\0';
    int ja = -1, jb = -1;
    const int ok = strcmp(rec.op, "layer") == 0 &&
                   scheme_of(rec.config, &ja, &jb);
    L->layer_ms = rec.time_ms;
    L->model_ms = rec.model_ms;
    L->pdl = ok ? stof__layer_record_pdl(rec.config) : -1;
    stof__db_record_clear(&rec);
    if (!ok) {
        L->layer_ms = L->model_ms = 0.0;
        L->db_replace = 1;
        snprintf(L->db_why, sizeof(L->db_why), "its scheme is malformed");
        stof__log(L->ctx, STOF_LOG_WARN,
                  "layer record %s is malformed; tuning again", L->key);
        return STOF_ERR_NOT_FOUND;
    }
    stof__layer_build_steps(L, ja, jb);
    stof_status st = STOF_OK;
    /* Where a database hit's time goes (ms): the kernels' lookups, their
     * modules, cuBLASLt's descriptors and checks. */
    double t_lookup = 0.0, t_mod = 0.0, t_lt = 0.0, t;
    /* The kernels' records that this host has not verified yet. */
    stof_db_record fresh[MAX_STEPS];
    int fresh_step[MAX_STEPS], n_fresh = 0;
    for (int i = 0; i < L->n_steps && st == STOF_OK; i++) {
        const step *s = &L->steps[i];
        if (s->kind == STEP_ATTN)
            continue;
        const char *slot = s->kind == STEP_GEMM ? g_slot[s->op] : n_slot[s->op];
        char key[33];
        stof__layer_op_key(L, slot, key);
        /* The record without its cubin when the memo serves it (its module
         * is then usually loaded already, found by the cubin's hash: no
         * copy, no hash of the bytes); read whole when the module must be
         * loaded or the bytes are the kernel (cuBLASLt's algorithm). */
        int missing = 0;
        for (int whole = 0;; whole = 1) {
            t = stof__now_ms();
            const stof_status found = whole ? stof__db_lookup_again(db, key, &rec)
                                            : stof__db_lookup_lazy(db, key, &rec);
            t_lookup += stof__now_ms() - t;
            if (found != STOF_OK) {
                missing = 1;
                break;
            }
            const int lazy = !rec.cubin && rec.cubin_size && rec.cubin_xxh3;
            int need_bytes = 0;
            if (s->kind == STEP_GEMM) {
                gemm_op *g = &L->g[s->op];
                stof_gemm_cfg c;
                stof_gemm_epi e;
                int ver = 0;
                t = stof__now_ms();
                if (strcmp(rec.kernel, "cublaslt") == 0 &&
                    stof__json_ints(rec.config, lt_key, 1, &ver) &&
                    (size_t)ver == stof__blaslt_version() &&
                    rec.cubin_size == STOF_BLASLT_ALGO_BYTES) {
                    need_bytes = lazy;
                    st = lazy ? STOF_ERR_NOT_FOUND
                              : stof__layer_gemm_load_lt(L, g, rec.cubin);
                    t_lt += stof__now_ms() - t;
                } else if (strcmp(rec.kernel, "gemm") == 0 &&
                           stof__gemm_cfg_parse(rec.config, &c, &e) &&
                           epi_matches(g, &c, &e) && (rec.cubin || lazy) &&
                           /* (the compile's own check: a crafted tile
                            * never reaches a launch) */
                           stof__gemm_cfg_valid(&L->ctx->device, &c, &e,
                                                e.norm ? g->N : 8, 8, NULL,
                                                0) &&
                           stof__gemm_ws_bytes(&c, &e, g->M, g->N) <=
                               L->norm_ws_bytes) {
                    /* (a valid tile whose norm workspace is larger than
                     * the plan's, e.g. 64 columns wide, is not used) */
                    st = stof__layer_gemm_load_template(
                        L, g, &c, rec.cubin, rec.cubin_size, rec.cubin_xxh3);
                    need_bytes = lazy && st == STOF_ERR_NOT_FOUND;
                    t_mod += stof__now_ms() - t;
                } else {
                    st = STOF_ERR_NOT_FOUND;
                }
                g->ms = rec.time_ms;
                g->model_ms = rec.model_ms;
                g->n_timed = rec.n_candidates;
            } else {
                norm_op *n = &L->n[s->op];
                int warps = 0;
                t = stof__now_ms();
                /* (what the kernel was compiled for must be this
                 * slot's: the key alone would not catch a change of what
                 * a slot means) */
                if (strcmp(rec.kernel, "norm") == 0 &&
                    stof__layer_norm_record_matches(rec.config, n,
                                                    (int)L->d.norm, &warps) &&
                    (rec.cubin || lazy)) {
                    st = stof__layer_norm_load(L, n, warps, rec.cubin,
                                               rec.cubin_size, rec.cubin_xxh3);
                    need_bytes = lazy && st == STOF_ERR_NOT_FOUND;
                } else {
                    st = STOF_ERR_NOT_FOUND;
                }
                t_mod += stof__now_ms() - t;
                n->ms = rec.time_ms;
            }
            if (!need_bytes || whole)
                break;
            stof__db_record_clear(&rec);
            st = STOF_OK;
        }
        if (missing) {
            snprintf(L->db_why, sizeof(L->db_why),
                     "the record of its %s kernel (%s) is missing", slot,
                     key);
            stof__log(L->ctx, STOF_LOG_WARN,
                      "layer %s: the record of its %s kernel is missing; "
                      "tuning again",
                      L->key, slot);
            st = STOF_ERR_NOT_FOUND;
            break;
        }
        if (st != STOF_OK) {
            L->db_transient = st == STOF_ERR_OUT_OF_MEMORY;
            snprintf(L->db_bad_key, sizeof(L->db_bad_key), "%s", key);
            snprintf(L->db_why, sizeof(L->db_why),
                     "its stored %s kernel cannot be used (%s)", slot,
                     stof_status_str(st));
            stof__log(L->ctx, STOF_LOG_WARN,
                      "layer %s: its stored %s kernel cannot be used (%s); "
                      "%s",
                      L->key, slot, stof_status_str(st),
                      L->db_transient ? "not used this time, kept"
                                      : "tuning again");
        }
        if (st == STOF_OK && !stof__db_trusted(db, &rec) &&
            n_fresh < MAX_STEPS) {
            fresh[n_fresh] = rec;
            fresh[n_fresh].cubin = NULL;
            fresh_step[n_fresh++] = i;
        }
        stof__db_record_clear(&rec);
    }
    /* (A split first FFN GEMM runs, and is verified, with the gate; a
     * split QKV GEMM of a RoPE layer with the rope kernel.) */
    if (st == STOF_OK && L->d.gated &&
        stof__layer_gemm_split(&L->g[G_FFN1], L->g[G_FFN1].lt,
                               &L->g[G_FFN1].cfg)) {
        st = stof__layer_gate_ready(L);
        L->db_transient = st != STOF_OK;
    }
    if (st == STOF_OK &&
        stof__layer_rope_split(&L->g[G_QKV], L->g[G_QKV].lt,
                               &L->g[G_QKV].cfg)) {
        st = stof__layer_rope_ready(L);
        L->db_transient = st != STOF_OK;
    }
    /* The buffers, now that the cuBLASLt kernels' workspace is known. */
    if (st == STOF_OK) {
        st = stof__layer_buffers(L, stof__layer_lt_need(L), 0);
        L->db_transient = st != STOF_OK;
    }
    if (st == STOF_OK && n_fresh)
        st = stof__layer_verify_loaded(L, db, fresh, fresh_step, n_fresh);
    stof__log(L->ctx, STOF_LOG_DEBUG,
              "layer %s from the database in %.3f ms: lookups %.3f ms, "
              "modules %.3f ms, cuBLASLt %.3f ms",
              L->key, stof__now_ms() - t_all, t_lookup, t_mod, t_lt);
    if (st != STOF_OK) {
        L->pdl = -1;
        /* (the search or the model's choice sets them again; a
         * description must not show the failed record's) */
        L->layer_ms = 0.0;
        L->model_ms = 0.0;
        /* records that failed for reasons of their own (a kernel record
         * missing, unusable or wrong here): the search's replace them */
        L->db_replace = !L->db_transient;
        if (!L->db_why[0])
            snprintf(L->db_why, sizeof(L->db_why), "%s", stof_errmsg(L->ctx));
        for (int i = 0; i < G_COUNT; i++)
            stof__layer_gemm_unload(L, &L->g[i]);
        for (int i = 0; i < N_COUNT; i++)
            stof__layer_norm_unload(L, &L->n[i]);
        return STOF_ERR_NOT_FOUND;
    }
    return STOF_OK;
}

void stof__layer_store(stof_layer *L, const char *spec, const char *mask_hex,
                       const layer_winner *wg, const layer_winner *wn,
                       int reps, int rows, double tol)
{
    stof_db *db = stof__ctx_db(L->ctx);
    if (!db || !stof__db_writable(db)) {
        stof__log(L->ctx, STOF_LOG_WARN,
                  "layer tuned but not stored: no writable tuning database");
        return;
    }
    /* A search after stored records failed here for reasons of their own
     * (stof__layer_from_db: L->db_replace) replaces them, whatever their
     * times: kept, they would send every later plan to the same failure
     * and a search again. */
    const int replace = L->ctx->settings.tuning_mode == STOF_TUNE_FORCE ||
                        L->db_replace;
    /* The kernels' records and then the scheme's, stored as one unit (the
     * scheme decides: stof__db_store_unit). */
    stof_db_record *recs = calloc((size_t)L->n_steps + 1, sizeof(*recs));
    if (!recs) {
        stof__log(L->ctx, STOF_LOG_WARN,
                  "layer %s: tuning records not stored: out of memory", L->key);
        return;
    }
    int m = 0;
    for (int i = 0; i < L->n_steps; i++) {
        const step *s = &L->steps[i];
        if (s->kind == STEP_ATTN)
            continue;
        stof_db_record r;
        record_base(L, mask_hex, spec, &r);
        const layer_winner *w = s->kind == STEP_GEMM ? &wg[s->op] : &wn[s->op];
        if (s->kind == STEP_GEMM) {
            const gemm_op *g = &L->g[s->op];
            stof__layer_op_key(L, g_slot[s->op], r.key);
            snprintf(r.op, sizeof(r.op), "gemm");
            r.batch = g->M;
            r.seq_q = g->N;
            r.seq_k = g->K;
            snprintf(r.layout, sizeof(r.layout), "rows");
            snprintf(r.kernel, sizeof(r.kernel), "%s",
                     g->lt ? "cublaslt" : "gemm");
            stof__layer_gemm_config_json(g, r.config, sizeof(r.config));
            r.cubin = g->lt ? (void *)w->algo : (void *)w->art;
            r.cubin_size = g->lt ? STOF_BLASLT_ALGO_BYTES : w->size;
            r.model_ms = w->first_ms;
        } else {
            const norm_op *n = &L->n[s->op];
            stof__layer_op_key(L, n_slot[s->op], r.key);
            snprintf(r.op, sizeof(r.op), "norm");
            r.batch = L->M;
            r.seq_q = L->d.hidden;
            snprintf(r.layout, sizeof(r.layout), "rows");
            snprintf(r.kernel, sizeof(r.kernel), "norm");
            stof__json_text(json_pack("{s:i, s:i, s:i, s:i, s:i}", "warps",
                                      n->warps, "bias", n->bias, "res",
                                      n->res, "pre", n->pre, "norm",
                                      (int)L->d.norm),
                            r.config, sizeof(r.config));
            r.cubin = (void *)w->art;
            r.cubin_size = w->size;
            r.model_ms = w->first_ms;
        }
        r.time_ms = w->ms;
        r.runner_up_ms = w->runner_up;
        r.n_candidates = w->n_timed;
        stof__json_text(json_pack("{s:s, s:i, s:i, s:i, s:f}", "method",
                                  "cuda events, median, L2 flushed", "reps",
                                  reps, "rejected", w->n_rejected,
                                  "checked_rows", rows, "tolerance", tol),
                        r.measured, sizeof(r.measured));
        recs[m++] = r;
    }
    stof_db_record r;
    record_base(L, mask_hex, spec, &r);
    snprintf(r.key, sizeof(r.key), "%s", L->key);
    snprintf(r.op, sizeof(r.op), "layer");
    r.batch = L->d.batch;
    r.heads = L->d.heads;
    r.seq_q = r.seq_k = L->d.seq;
    r.head_dim = L->hd;
    snprintf(r.layout, sizeof(r.layout), "layer");
    snprintf(r.kernel, sizeof(r.kernel), "scheme");
    /* With the rest of the descriptor, so `stof-tune verify` can plan the
     * layer again from the record alone (stof__layer_record_desc). */
    json_t *cfg = json_pack(
        "{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:I}", "ja",
        L->ja, "jb", L->jb, "pre", L->d.pre_norm, "hidden", L->d.hidden,
        "ffn", L->d.ffn, "act", (int)L->d.act, "norm", (int)L->d.norm,
        "kv_heads", L->d.kv_heads, "no_bias", L->d.no_bias, "gated",
        L->d.gated, "eps", (double)L->eps, "lt",
        (json_int_t)stof__blaslt_version());
    /* (only with RoPE: other records stay as they were) */
    if (cfg && L->d.rope_freq) {
        json_object_set_new(cfg, "rope_table", json_true());
        json_object_set_new(cfg, "rope_dim", json_integer(L->d.rope_dim));
    } else if (cfg && L->d.rope_theta != 0.0f) {
        json_object_set_new(cfg, "rope_theta",
                            json_real((double)L->d.rope_theta));
        json_object_set_new(cfg, "rope_dim", json_integer(L->d.rope_dim));
    }
    if (cfg && L->d.qk_norm) /* (only with a QK norm) */
        json_object_set_new(cfg, "qk_norm", json_integer(1));
    /* The search's timed choice of programmatic launches (a record
     * without it: the rule at load). */
    if (cfg && L->pdl >= 0)
        json_object_set_new(cfg, "pdl", json_integer(L->pdl));
    stof__json_text(cfg, r.config, sizeof(r.config));
    r.time_ms = L->layer_ms;
    r.model_ms = L->model_ms;
    r.n_candidates = J_COUNT;
    stof__json_text(json_pack("{s:s, s:i, s:s}", "method",
                              "cuda events, median, L2 flushed", "reps", reps,
                              "what", "one layer, scratch weights"),
                    r.measured, sizeof(r.measured));
    recs[m++] = r;
    if (stof__db_store_unit(db, recs, m, m - 1, replace, 1) != STOF_OK)
        stof__log(L->ctx, STOF_LOG_WARN,
                  "layer %s: its %d tuning records could not be stored: %s",
                  L->key, m, stof_errmsg(L->ctx));
    free(recs);
}
