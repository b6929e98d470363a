/*
 * layer_int.h - what the Transformer layer's files share: the chain's
 * buffers, operations and steps, the layer object, and the functions that
 * cross files (layer.c: the chain, schemes, launches, plan; layer_db.c:
 * keys, kernels loaded from the tuning database and stored to it;
 * layer_search.c: the layer's GEMM and norm operations of the search
 * engine, scratch data, and tuning). Not for other modules.
 */
#ifndef STOF_LAYER_INT_H
#define STOF_LAYER_INT_H

#include "internal.h"

#include "blaslt.h"
#include "db.h"
#include "gemm.h"

/* --- buffers, operations, steps ----------------------------------------- */

enum {
    SYM_NONE,
    SYM_X, SYM_Y, SYM_QKV, SYM_ATT, SYM_H, SYM_T, SYM_N, SYM_F, SYM_G,
    SYM_WQKV, SYM_BQKV, SYM_WO, SYM_BO, SYM_W1, SYM_B1, SYM_W2, SYM_B2,
    SYM_G1, SYM_BE1, SYM_G2, SYM_BE2,
    /* In a stack: the next layer's input norm (pre-norm layers whose
     * last GEMM normalises for the next layer, L->jb == J_FUSED) */
    SYM_G1_NEXT, SYM_BE1_NEXT,
    SYM_COUNT
};
#define SYM_FIRST_BUF SYM_QKV
#define SYM_LAST_BUF SYM_G /* a gated FFN's 2 ffn columns, when split */
#define SYM_FIRST_W SYM_WQKV

/* The GEMMs and norm kernels any scheme may use. */
enum { G_QKV, G_A_RES, G_A_PLAIN, G_A_NORM, G_FFN1, G_B_RES, G_B_PLAIN,
       G_B_NORM, G_COUNT };
enum { N_IN, N_A_PLAIN, N_A_BR, N_B_PLAIN, N_B_BR, N_COUNT };
enum { J_RES_NORM, J_BIAS_RES_NORM, J_FUSED, J_COUNT };

/* Names of the GEMM slots, norm slots and junction cuts (layer.c). */
extern const char *const stof__layer_g_slot[G_COUNT];
extern const char *const stof__layer_n_slot[N_COUNT];
extern const char *const stof__layer_j_name[J_COUNT];

typedef struct gemm_op {
    int used;
    int M, N, K;
    stof_gemm_epi epi;
    int qk_norm;    /* the QKV op of a layer with desc.qk_norm: the plain
                       product, then the qk kernel (norm and RoPE) */
    /* the chosen kernel */
    int ok, lt;
    stof_gemm_cfg cfg;
    CUmodule mod;
    CUfunction fn;
    stof_blaslt_gemm *ltg;
    double ms, model_ms;
    int n_timed, n_rejected;
} gemm_op;

typedef struct norm_op {
    int used;
    int bias, res, pre;
    int warps;
    int ok;
    CUmodule mod;
    CUfunction fn;
    double ms, model_ms;
} norm_op;

/* 1 when a norm record's configuration (text) is what slot n of a layer
 * with norm kind norm_kind compiles (bias, residual, pre-norm output, the
 * norm), with *warps its block size in 1..32. */
int stof__layer_norm_record_matches(const char *config, const norm_op *n,
                                    int norm_kind, int *warps);

enum { STEP_GEMM, STEP_NORM, STEP_ATTN };
/* Operand slots of a step. GEMM: a, w, bias, res, out, pre, gamma, beta.
 * NORM: a = x, res, bias, out, pre, gamma, beta. */
enum { O_A, O_W, O_BIAS, O_RES, O_OUT, O_PRE, O_GAMMA, O_BETA, O_COUNT };
typedef struct step {
    int kind, op;
    int s[O_COUNT];
    /* 1: runs only inside a stack, in place of the step before it, when
     * the next layer's input norm is fused into it (RUN_END_FUSED). */
    int stack_end;
} step;

/* stof__layer_run_steps' mode bits: skip the input norm (N holds the
 * previous layer's fused output), end with the stack_end step. */
enum { RUN_SKIP_NORM_IN = 1, RUN_END_FUSED = 2 };

#define MAX_STEPS 12

struct stof_layer {
    stof_context *ctx;
    stof_layer_desc d;
    int M, hd;
    float eps;
    stof_plan *attn;          /* a family plan for stof_layer_plan_family */
    const stof_mask_data *run_data; /* the instance of the run in progress
                                       (stof_layer_run_family), or NULL */
    gemm_op g[G_COUNT];
    norm_op n[N_COUNT];
    int ja, jb;
    step steps[MAX_STEPS];
    int n_steps;
    CUdeviceptr buf[SYM_COUNT]; /* intermediates (QKV..G) */
    CUmodule gate_mod;        /* desc.gated: the gate kernel (stof_gate) */
    CUfunction gate_fn;
    int rope;                 /* RoPE's rotated channels a head (0: none) */
    float rope_freq[128];     /* its frequencies, f_i of pair i (theta's,
                                 or a copy of desc.rope_freq's) */
    float rope_scale;         /* cos and sin multiplied by it (1: none) */
    CUdeviceptr rope_tab;     /* its (cos, sin) table [seq][rope / 2] (the
                                 context's: stof__rope_dev_get) */
    CUmodule rope_mod;        /* the rope kernel of a QKV GEMM that cannot
                                 fuse it (stof_rope), or with desc.qk_norm
                                 the qk kernel (stof_qk_norm) */
    CUfunction rope_fn;
    CUdeviceptr mem, lt_ws, norm_ws; /* norm_ws: the Hopper GEMMs' with a
                                        norm (stof__gemm_ws_bytes) */
    size_t mem_bytes;         /* mem's size */
    int buf_all;              /* mem holds every scheme's buffers (a
                                 search's), not only L->steps' */
    CUdeviceptr lt_mem;       /* the part of mem for cuBLASLt's workspace */
    size_t lt_mem_bytes;      /* (0: none) */
    size_t lt_ws_bytes;       /* cuBLASLt's workspace in use, at lt_ws
                                 (stof__layer_lt_ws): lt_mem or its own */
    int lt_in_mem;            /* 1: lt_ws is lt_mem */
    size_t norm_ws_bytes;     /* its size: a stored configuration needing
                                 more is not used */
    size_t norm_ws_max;       /* the most a candidate needs (a search's
                                 buffers); the chosen kernels' buffers
                                 hold what they need */
    CUstream cap_stream;
    CUgraph graph;
    CUgraphExec gexec;
    uint64_t graph_key;
    char key[33];
    char key_text[1024];
    char source[16];       /* "database", "tuned", "model" */
    double layer_ms, model_ms, tune_s;
    double verify_ms;       /* first use of database kernels here */
    /* stof__layer_from_db's last run: the kernel record it stopped at
     * ("" when a record was missing, or none), why, and whether that was
     * this host's trouble (memory, a compile) rather than the records'
     * (`stof-tune verify` reports these per record). */
    char db_bad_key[33];
    char db_why[256];
    int db_transient;
    int db_replace;         /* its records failed for reasons of their own:
                               the search's replace them (stof__layer_store) */
    double plan_ms[3];      /* the plan's parts: the attention plan, the
                               buffers, the kernels (database or search) */
    int pdl;                /* its launches ask for programmatic dependent
                               launch (stof__pdl_scope) unless STOF_PDL
                               decides: the search's choice (timed, kept in
                               the layer record), else stof__layer_pdl_rule;
                               -1 while the plan is made */
    double pdl_ms[2];       /* the search's timing of that choice, ms a
                               layer without / with (0: not timed here) */
    char errmsg[1024];
};

/* The mode of layer i of a stack of n (stof__layer_run_steps' bits): a
 * pre-norm scheme whose last GEMM can normalise for the next layer
 * (J_FUSED) ends each layer but the last with it and skips the input norm
 * of each but the first. */
static inline int stof__layer_stack_mode(const stof_layer *L, int i, int n)
{
    const int fused = L->d.pre_norm && L->jb == J_FUSED;
    return (fused && i > 0 ? RUN_SKIP_NORM_IN : 0) |
           (fused && i + 1 < n ? RUN_END_FUSED : 0);
}

/* Programmatic dependent launch for a layer plan whose search did not
 * time it (a record made before the search did, a cache-only miss, a
 * tuning budget spent): on compute capability 9.0+ and at most this many
 * tokens (batch x seq). Measured (H200, 2026-11-28, eighth session: stacks
 * in CUDA graphs, PDL on / off in alternating processes): 128-2048 tokens
 * 1-5% faster in 16 of 18 stacks (BERT-base, GPT-2, BERT-large at 1x128
 * to 4x512; one 2.5% slower, one even), 4096 tokens up to 2.5% slower. */
#define STOF_LAYER_PDL_TOKENS 2048
int stof__layer_pdl_rule(const stof_device *dev, int tokens);
/* The search's choice from its stack graphs' times (ms a layer without and
 * with): on or off where they differ by more than STOF_LAYER_PDL_MARGIN,
 * else `rule` (differences within the timings' spread decide nothing; H200,
 * 2026-11-28, ninth session: 12 stacks of 128-4096 tokens, the timed
 * choice against the stacks in alternating processes). */
#define STOF_LAYER_PDL_MARGIN 0.01
int stof__layer_pdl_pick(double off_ms, double on_ms, int rule);
/* The choice a layer record's configuration keeps ("pdl": 0 or 1), or -1
 * when it has none (the rule decides). */
int stof__layer_record_pdl(const char *config);

/* --- layer.c: the chain ---------------------------------------------------- */

/* Elements per token row of buffer sym. */
int stof__layer_tok_ld(const stof_layer *L, int sym);

/* A gated op (the first FFN GEMM of a gated layer) runs split on
 * cuBLASLt (lt) and the mma.sync template (the 2 ffn-wide GEMM with the
 * bias into SYM_G, then the gate kernel); only the Hopper template fuses
 * it. The epilogue the kernel itself is built with. */
int stof__layer_gemm_split(const gemm_op *g, int lt, const stof_gemm_cfg *c);
stof_gemm_epi stof__layer_kernel_epi(const gemm_op *g, int lt,
                                     const stof_gemm_cfg *c);

/* A gated layer's split first FFN GEMM needs the [tokens][2 ffn] buffer
 * and the gate kernel (NVRTC, tens of ms): made here, once, when a split
 * kernel is timed or chosen; nothing for other layers. */
stof_status stof__layer_gate_ready(stof_layer *L);

/* A QKV GEMM with RoPE runs split (the plain GEMM, then the rope kernel
 * in place) on cuBLASLt, the mma.sync template and Hopper tiles that do
 * not hold whole heads (heads of 80 in any, of 96 in all but 192) or
 * rotate other than a multiple of 16 channels; the Hopper template fuses
 * it in the others. With a QK norm (g->qk_norm) always: the qk kernel
 * after the plain product. */
int stof__layer_rope_split(const gemm_op *g, int lt, const stof_gemm_cfg *c);

/* A RoPE layer's rope kernel (only when a split QKV GEMM is timed or
 * chosen; its cubin is kept for the process); nothing for other layers. */
stof_status stof__layer_rope_ready(stof_layer *L);

/* The context's RoPE table of seq positions, rope channels, frequencies
 * freq[rope / 2] and scale on the device (rope_cache.c: computed once a
 * process, uploaded once a context; the same table for the same bits),
 * with a reference the plan gives back with stof__rope_dev_put (the
 * context current). */
stof_status stof__rope_dev_get(stof_context *ctx, int seq, int rope,
                               const float *freq, float scale,
                               CUdeviceptr *out /* OUT */);
void stof__rope_dev_put(stof_context *ctx, CUdeviceptr p);

/* Stand-in frequencies (128 of them) for a record of a layer with its own
 * (desc.rope_freq: the key names none): a scheme does not depend on
 * them, so re-planning a record (stof-tune verify, a workload's
 * rope=table) uses these. */
const float *stof__rope_freq_standin(void);

/* A head's size (desc.head_dim, or hidden / heads) and the attention's
 * width, heads of it (the Q columns; hidden unless head_dim says
 * otherwise). */
static inline int stof__layer_hd(const stof_layer_desc *d)
{
    return d->head_dim > 0 ? d->head_dim
                           : d->heads > 0 ? d->hidden / d->heads : 0;
}
static inline int stof__layer_qd(const stof_layer_desc *d)
{
    return d->heads * stof__layer_hd(d);
}

/* Whether the descriptor asks for RoPE (a base or frequencies). */
static inline int stof__layer_has_rope(const stof_layer_desc *d)
{
    return d->rope_theta != 0.0f || d->rope_freq != NULL;
}

/* Check a layer descriptor, and the mask's sizes when m is not NULL
 * (layer_desc.c): STOF_ERR_INVALID_ARGUMENT naming the field. */
stof_status stof__layer_check_desc(stof_context *ctx,
                                   const stof_layer_desc *d,
                                   const stof_mask *m);

/* Columns of the QKV projection: qd + 2 * kv_heads * head_dim. */
int stof__layer_qkv_n(const stof_layer_desc *d);
/* The steps of scheme (ja, jb) into L->steps. */
void stof__layer_build_steps(stof_layer *L, int ja, int jb);
/* The cost of option j of the junction whose GEMMs start at g0 and norm
 * kernels at n0: its GEMM's, plus its norm kernel's unless fused; the
 * measured times, or the model's. INFINITY when an op is missing. */
double stof__layer_junction_cost(const stof_layer *L, int j, int g0, int n0,
                                 int measured);
/* The cheapest cut of a junction (measured or modelled costs), or -1. */
int stof__layer_pick_junction(const stof_layer *L, int g0, int n0,
                              int measured);
/* The device pointer of symbol s (weights wp, input x, output y). */
CUdeviceptr stof__layer_sym_ptr(const stof_layer *L, const CUdeviceptr *wp,
                                CUdeviceptr x, CUdeviceptr y, int s);
stof_status stof__layer_launch_gemm(stof_layer *L, const gemm_op *g,
                                    const step *s, const CUdeviceptr *wp,
                                    CUdeviceptr x, CUdeviceptr y,
                                    CUstream stream);
stof_status stof__layer_launch_norm(stof_layer *L, const norm_op *n,
                                    const step *s, const CUdeviceptr *wp,
                                    CUdeviceptr x, CUdeviceptr y,
                                    CUstream stream);
/* The layer's error message (stof_layer_errmsg) from fmt; returns st. */
int stof__layer_fail(stof_layer *L, stof_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Destroy the stack's captured graph, if any (the context current). */
void stof__layer_graph_drop(stof_layer *L);
/* Where the intermediates QKV..F lie in the plan's allocation (bytes from
 * its start, 256-aligned; STOF_LAYER_NO_BUF for one not used), buffers
 * whose lives do not overlap sharing memory; returns their extent. all:
 * what any scheme uses (a search), else what L->steps use. */
#define STOF_LAYER_NO_BUF ((size_t)-1)
size_t stof__layer_buf_layout(const stof_layer *L, int all,
                              size_t off[SYM_COUNT]);
/* Allocate the plan's buffers (one allocation: the intermediates, the
 * norm GEMMs' workspace of norm_ws_bytes, zeroed, and lt_bytes of
 * cuBLASLt workspace) unless they are, for every scheme (all, a search)
 * or L->steps' (stof__layer_buf_layout); allocated for one scheme and
 * asked for all, they are made again. The time goes to plan_ms[1]. */
stof_status stof__layer_buffers(stof_layer *L, size_t lt_bytes, int all);
/* The workspace the loaded cuBLASLt kernels need (bytes; 0 with none). */
size_t stof__layer_lt_need(const stof_layer *L);
/* Make L's cuBLASLt workspace `bytes` (exact) or at least that (else):
 * the part of the buffers' allocation when it is large enough, else an
 * allocation of its own (dropping the layer's graph when the address
 * changes); the time goes to plan_ms[1]. */
stof_status stof__layer_lt_ws(stof_layer *L, size_t bytes, int exact);
/* Whether step i runs in `mode` (RUN_* bits, 0 for one layer). */
int stof__layer_step_runs(const stof_layer *L, int i, int mode);
/* Enqueue the steps (mode: RUN_* bits, 0 for one layer); the context
 * must be current. */
stof_status stof__layer_run_steps(stof_layer *L, const CUdeviceptr *wp,
                                  CUdeviceptr x, CUdeviceptr y,
                                  CUstream stream, int mode);
/* A GEMM's configuration as stored in records and described. */
void stof__layer_gemm_config_json(const gemm_op *g, char *buf, size_t n);
const char *stof__layer_dtype_str(stof_dtype t);

/* --- layer_probe.c: scratch data, verification, timing -------------------- */

#define FLUSH_BYTES (128u << 20)
#define VROWS 6     /* rows checked against the C reference */

typedef struct aux_kernels {
    CUmodule mod;
    CUfunction fill;
} aux_kernels;

/* A GEMM's reference on the sampled rows, with the inputs it was computed
 * from: every candidate of an op reads the same inputs, so the reference
 * (a large share of a wide FFN's tuning time on the CPU) is computed once
 * and reused while the inputs are bit-identical. */
typedef struct ref_entry {
    float *in, *ref, *ref_pre; /* one allocation: inputs, then outputs */
    size_t n_in;
} ref_entry;

/* The scratch data and state of one layer tuning. */
typedef struct layer_tuner {
    stof_layer *L;
    CUdeviceptr scratch, flush;
    CUdeviceptr wp[SYM_COUNT];
    CUdeviceptr x, y;
    CUevent e0, e1;
    int reps;
    double deadline;       /* seconds on the monotonic clock; 0 = none */
    int rows[VROWS], n_rows;
    float tol;
    aux_kernels aux;
    float *w_host[G_COUNT]; /* each GEMM's scratch weight, fetched once */
    ref_entry ref_cache[G_COUNT];
} layer_tuner;

/* Scratch buffers, events and the fill kernel for L's kernels (the context
 * current); stop frees them. */
stof_status stof__layer_tuner_start(stof_layer *L, layer_tuner *t);
void stof__layer_tuner_stop(layer_tuner *t);
/* Run step s on the scratch data (no synchronisation). */
stof_status stof__layer_launch_step(layer_tuner *t, const step *s);
/* Fill s's outputs (and its pre-norm output) with 0xff, a NaN in fp16 and
 * bf16, before a checked run: an element a candidate leaves unwritten
 * then fails the comparison instead of passing on the value an earlier
 * candidate left there. An output lying over one of the step's inputs is
 * left as it is. */
stof_status stof__layer_poison_step(layer_tuner *t, const step *s);
/* Fill those outputs with finite scratch data again (after a candidate
 * that left some of them unwritten: later steps read them as inputs). */
stof_status stof__layer_refill_step(layer_tuner *t, const step *s);
/* The relative error of s's last output on the sampled rows against the C
 * reference (INFINITY when it cannot tell). */
double stof__layer_verify_step(layer_tuner *t, const step *s);
/* Median time of t->reps runs of s (or of the whole layer when s is NULL),
 * each after flushing L2. 0 on success. */
int stof__layer_time_it(layer_tuner *t, const step *s, double *ms);
/* The step that exercises op (gemm or norm) on scratch buffers. */
int stof__layer_probe_step(stof_layer *L, int is_norm, int op, step *out);
/* The chosen scheme as a stack runs it, a CUDA graph of 8 layers on the
 * scratch data, with programmatic launches off and on: the median of
 * PDL_ROUNDS replays each, alternating, in ms a layer (ms[0] off, ms[1]
 * on). 0 on success. */
#define PDL_ROUNDS 7
int stof__layer_time_pdl(layer_tuner *t, double ms[2]);

/* --- layer_db.c: keys, kernels, records ------------------------------------ */

/* L->key and L->key_text from the layer, the mask, the device and the
 * versions; the key of one of its kernels (slot). */
void stof__layer_key(stof_layer *L, const char *mask_hex);
void stof__layer_op_key(const stof_layer *L, const char *slot, char key[33]);
/* The key of a key text (XXH3-128, hex). */
void stof__layer_key_hash(const char *text, char key[33]);
/* A kernel's key from its layer's key text (L->key_text). */
void stof__layer_op_key_of(const char *layer_key_text, const char *slot,
                           char key[33]);
/* stof-tune verify: the layer descriptor a scheme record (op "layer") was
 * tuned for, found by its key, and that key's text (tn bytes). 1: found;
 * 2: found, made with another cuBLASLt version than this host's; 0: not
 * found, with why (*old = 1 when the record predates the full descriptor
 * in its configuration and matched none of the usual values of the
 * missing fields). */
int stof__layer_record_desc(stof_context *ctx, const stof_db_record *r,
                            stof_layer_desc *d, int *old, char *text,
                            size_t tn, char *why, size_t n);
void stof__layer_gemm_unload(stof_layer *L, gemm_op *g);
void stof__layer_norm_unload(stof_layer *L, norm_op *n);
/* (hash: the cubin's XXH3-64 or 0; cubin NULL: a module the context's
 * cache holds, else STOF_ERR_NOT_FOUND: stof__module_load_shared_hashed) */
stof_status stof__layer_gemm_load_template(stof_layer *L, gemm_op *g,
                                           const stof_gemm_cfg *c,
                                           const void *cubin, size_t size,
                                           uint64_t hash);
stof_status stof__layer_gemm_load_lt(stof_layer *L, gemm_op *g,
                                     const void *algo);
stof_status stof__layer_norm_load(stof_layer *L, norm_op *n, int warps,
                                  const void *cubin, size_t size,
                                  uint64_t hash);
/* Unload the kernels no step of the current scheme uses. */
void stof__layer_unload_unused(stof_layer *L);
/* Load the scheme and its kernels stored under L's keys, each record
 * verified on this GPU at its first use: STOF_OK, or STOF_ERR_NOT_FOUND (a
 * miss, or something unusable: logged). */
stof_status stof__layer_from_db(stof_layer *L);

/* What tuning found for one GEMM or norm op, for its record. */
typedef struct layer_winner {
    int found;
    const void *art;          /* template or norm cubin (not owned) */
    size_t size;
    uint8_t algo[STOF_BLASLT_ALGO_BYTES]; /* cuBLASLt: the algorithm */
    double ms, runner_up, first_ms;
    int n_timed, n_rejected;
} layer_winner;

/* Store the used kernels' records and the layer's (its scheme); spec: the
 * mask's or family's spec for the records (NULL: none). */
void stof__layer_store(stof_layer *L, const char *spec, const char *mask_hex,
                       const layer_winner *wg, const layer_winner *wn,
                       int reps, int rows, double tol);

/* --- layer_search.c: tuning ------------------------------------------------ */

/* Tune the layer's kernels through the search engine and pick the scheme
 * (model_only: the cost model's choices, nothing run), then store. */
stof_status stof__layer_tune(stof_layer *L, const char *spec,
                             const char *mask_hex, int model_only);

/* Verify kernels loaded from the database (steps step_of[i], records
 * recs[i]) on this GPU before their first use; trusted ones are
 * remembered, a failure is logged and makes the layer tune again
 * (STOF_ERR_NOT_FOUND). */
stof_status stof__layer_verify_loaded(stof_layer *L, stof_db *db,
                                      const stof_db_record *recs,
                                      const int *step_of, int n);

#endif
