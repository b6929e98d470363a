/*
 * test_pool_bound.c - stof__mb_pool_bound (mask_build.h): the most partial
 * tiles any instance of a family can have per sequence. It sizes the GPU
 * format builder's bitmap pool, so a bound below one instance's true count
 * (the CPU builder's n_partial) means wrong attention. Checked on bounded
 * specs and random combinations of bounded leaves with random and
 * adversarial instances (odd and tiny sizes, seq_q != seq_k, lengths 0, 1,
 * seq-1 and on tile edges +-1, offsets on tile edges +-1 +-W, bottom-right,
 * near 2^30), by a hill climb over one sequence's data, and by brute force
 * over offsets for sliding:W; that the bound is active (below every tile)
 * in many cases; and every tile for strided, docs and dilated:W:D>1.
 * A failure says COUNTEREXAMPLE with the spec, sizes, instance, tiling and
 * replay seed (STOF_TEST_SEED).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "mask_build.h"
#include "spec.h"
#include "stof.h"
#include "testutil.h"

static const int block_sizes[] = {16, 32, 64, 128, 256};
static const int kern_bm[] = {64, 128}, kern_bn[] = {32, 64, 128};

/* An instance: a batch of 1..3 sequences of at most sq x sk. */
typedef struct inst {
    int batch, sq, sk;
    int32_t q_len[3], k_len[3], q_off[3], prefix[3];
    stof_mask_data d;
} inst;

/* A family under test, its program (as stof_attention_plan_family makes
 * it), and a tally: cases checked, cases with bound < every tile, and the
 * largest n_partial / bound among those (how close an instance came). */
typedef struct subj {
    stof_context *ctx;
    const char *spec;
    stof_mask_family *fam;
    int32_t prog[4 * STOF_MB_MAX_NODES];
    int n;
    long cases, active;
    double worst;
} subj;

static void subj_open(subj *s, const char *spec)
{
    memset(s, 0, sizeof(*s));
    s->spec = spec;
    cr_assert_eq(stof_open(&s->ctx, NULL), STOF_OK, "%s",
                 stof_errmsg(s->ctx));
    cr_assert_eq(stof_mask_family_create(s->ctx, spec, &s->fam), STOF_OK,
                 "family \"%s\": %s", spec, stof_errmsg(s->ctx));
    int depth = 0;
    s->n = stof__spec_program(stof__family_spec(s->fam), s->prog,
                              STOF_MB_MAX_NODES, &depth);
    cr_assert(s->n > 0 && depth <= STOF_MB_MAX_STACK,
              "\"%s\": program %d nodes, depth %d", spec, s->n, depth);
}

static void subj_close(subj *s, int log)
{
    if (log)
        cr_log_info("\"%.200s\": %ld cases, bound active in %ld, worst "
                "n_partial/bound there %.3f", s->spec, s->cases,
                    s->active, s->worst);
    stof_mask_family_free(&s->fam);
    stof_close(&s->ctx);
}

static int cdiv(int a, int b) { return (a + b - 1) / b; }

static int clampi(long v, int lo, int hi)
{
    return v < lo ? lo : (v > hi ? hi : (int)v);
}

static int64_t bound_of(const subj *s, int sq, int sk, int bm, int bn)
{
    return stof__mb_pool_bound(s->prog, s->n, cdiv(sq, bm), cdiv(sk, bn), bm,
                               bn);
}

/* Sequence b at bm x bn: asserts n_partial <= bound; returns n_partial. */
static int64_t check_seq(subj *s, const inst *in, int b, int bm, int bn)
{
    const int64_t all = (int64_t)cdiv(in->sq, bm) * cdiv(in->sk, bn);
    const int64_t bound = bound_of(s, in->sq, in->sk, bm, bn);
    cr_assert(bound >= 0 && bound <= all, "\"%s\" %dx%d: bound %" PRId64
              " of %" PRId64 " tiles", s->spec, bm, bn, bound, all);
    stof_format *f = NULL;
    cr_assert_eq(stof_format_build_family(s->ctx, s->fam, in->sq, in->sk,
                                          &in->d, b, bm, bn, &f),
                 STOF_OK, "\"%s\": %s", s->spec, stof_errmsg(s->ctx));
    const int64_t np = f->n_partial;
    stof_format_free(&f);
    cr_assert(np <= bound,
              "COUNTEREXAMPLE \"%s\" seq %dx%d (q_len %d k_len %d q_offset %d "
              "prefix %d) tiles %dx%d: %" PRId64 " partial tiles > bound %"
              PRId64 " (of %" PRId64 "); STOF_TEST_SEED=%" PRIu64,
              s->spec, in->sq, in->sk, in->q_len[b], in->k_len[b],
              in->q_off[b], in->prefix[b], bm, bn, np, bound, all, tu_seed());
    s->cases++;
    if (bound < all && bound > 0) {
        s->active++;
        if ((double)np / (double)bound > s->worst)
            s->worst = (double)np / (double)bound;
    }
    return np;
}

/* Every sequence at every tiling (`every`) or at the kernels' tilings. */
static void check_inst(subj *s, const inst *in, int every)
{
    cr_assert_eq(stof_mask_data_check(s->ctx, s->fam, in->batch, in->sq,
                                      in->sk, &in->d),
                 STOF_OK, "%s", stof_errmsg(s->ctx));
    for (int i = 0; i < (every ? 5 : 2); i++)
        for (int j = 0; j < (every ? 5 : 3); j++)
            for (int b = 0; b < in->batch; b++)
                check_seq(s, in, b, every ? block_sizes[i] : kern_bm[i],
                          every ? block_sizes[j] : kern_bn[j]);
}

/* A multiple of 16 << (0..4) up to `max`, -1, 0 or +1, and +-shift (a
 * window) half of the time: a diagonal or a line on a tile edge. */
static long near_edge(tu_rng *r, long max, long shift)
{
    const long unit = 16L << tu_below(r, 5);
    long v = unit * (long)tu_below(r, (uint64_t)(max / unit + 1)) - 1 +
             (long)tu_below(r, 3);
    return tu_below(r, 2) ? v : v + (tu_below(r, 2) ? shift : -shift);
}

/* A size: tiny, anything, a multiple of 256 +-1, or near the largest. */
static int rand_size(tu_rng *r)
{
    const long v[] = {1 + (long)tu_below(r, 40), 1 + (long)tu_below(r, 3000),
                      256L * (1 + (long)tu_below(r, 11)) - 1 +
                          (long)tu_below(r, 3),
                      3000 - (long)tu_below(r, 3)};
    return clampi(v[tu_below(r, 4)], 1, 3000);
}

/* A length 0..seq: 0, 1, seq-1, seq, near a tile edge, or any. */
static int rand_len(tu_rng *r, int seq)
{
    const long v[] = {0, 1, seq - 1, seq, near_edge(r, seq, 0),
                      (long)tu_below(r, (uint64_t)seq + 1)};
    return clampi(v[tu_below(r, 6)], 0, seq);
}

/* A random instance of `batch` sequences; w: a window that shifts edges. */
static void rand_inst(tu_rng *r, inst *in, int batch, long w)
{
    memset(in, 0, sizeof(*in));
    in->batch = batch;
    in->sq = rand_size(r);
    in->sk = tu_below(r, 4) ? rand_size(r) : in->sq;
    for (int b = 0; b < batch; b++) {
        const int ql = in->q_len[b] = rand_len(r, in->sq);
        const int kl = in->k_len[b] = rand_len(r, in->sk);
        const long offs[] = {0, kl - ql, (long)tu_below(r, 4000),
                             (1L << 30) - (long)tu_below(r, 5000),
                             near_edge(r, 4000, w), near_edge(r, 4000, w)};
        in->q_off[b] = clampi(offs[tu_below(r, 6)], 0, 1 << 30);
        in->prefix[b] = clampi(tu_below(r, 2) ? near_edge(r, in->sk + 64, w)
                                              : (long)tu_below(r, in->sk + 99u),
                               0, 1 << 30);
    }
    in->d.q_len = in->q_len;
    in->d.k_len = in->k_len;
    in->d.q_offset = in->q_off;
    in->d.prefix = in->prefix;
}

/* The bounded specs on random and adversarial instances; the bound is
 * below every tile in many cases (else the test would be worthless). */
Test(pool_bound, bounded_specs_random_instances)
{
    static const char *const specs[] = {
        "causal", "sliding:37", "sliding:1000", "causal_sliding:100",
        "longformer:40:9", "prefix", "prefix:77", "causal|prefix",
        "!(sliding:50)&causal", "dilated:64:1", "prefix:10&!causal",
        "sliding:20|causal_sliding:300", "!causal", "dense", "none"};
    tu_rng rng = {tu_seed() ^ 0xb0b0};
    long cases = 0, active = 0;
    for (int i = 0; i < 15; i++) {
        subj s;
        subj_open(&s, specs[i]);
        for (int it = 0; it < 300; it++) {
            inst in;
            rand_inst(&rng, &in, 2 + (int)tu_below(&rng, 2),
                      37 + (long)tu_below(&rng, 300));
            check_inst(&s, &in, it % 4 == 0);
        }
        cases += s.cases;
        active += s.active;
        subj_close(&s, 1);
    }
    cr_log_info("bounded specs: %ld cases, bound active in %ld", cases,
                active);
    cr_assert(active * 3 >= cases, "bound active in %ld of %ld cases", active,
              cases);
    subj s; /* sliding:37 at 3000 x 3000 on 64 x 32 tiles: far below 47 x 94 */
    subj_open(&s, "sliding:37");
    const int64_t b = bound_of(&s, 3000, 3000, 64, 32);
    cr_assert(b < 47 * 94 / 4, "sliding:37: bound %" PRId64 " of 4418", b);
    subj_close(&s, 0);
}

/* A random spec of bounded leaves, depth <= 3, into buf (768 bytes hold
 * any): a leaf, !(a) op b or (a) op (b). */
static void rand_spec(tu_rng *r, char *buf, size_t cap, int depth)
{
    static const char *const leaves[] = {
        "causal", "sliding:%d", "causal_sliding:%d", "longformer:%d:%d",
        "prefix", "prefix:%d", "dilated:%d:1", "!causal", "dense", "none"};
    const int k = depth >= 3 ? 2 : (int)tu_below(r, depth == 0 ? 2 : 5);
    const int w = 1 + (int)tu_below(r, 400), g = (int)tu_below(r, 300);
    if (k >= 2) {
        const int i = (int)tu_below(r, 10);
        snprintf(buf, cap, leaves[i], i == 5 ? g * 10 : w, g);
        return;
    }
    snprintf(buf, cap, k == 0 ? "!(" : "(");
    size_t len = strlen(buf);
    rand_spec(r, buf + len, cap - len, depth + 1);
    len = strlen(buf);
    snprintf(buf + len, cap - len, k == 0 ? ")%s" : ")%s(",
             tu_below(r, 2) ? "&" : "|");
    len = strlen(buf);
    rand_spec(r, buf + len, cap - len, depth + 1);
    len = strlen(buf);
    snprintf(buf + len, cap - len, k == 0 ? "" : ")");
}

/* Random combinations of bounded leaves: a tile partial in a combination is
 * partial in a leaf or on the length box, so the bound holds for them. */
Test(pool_bound, random_combinations)
{
    tu_rng rng = {tu_seed() ^ 0xc0c0};
    subj all = {.spec = "random combinations"};
    for (int i = 0; i < 500; i++) {
        char spec[768];
        rand_spec(&rng, spec, sizeof(spec), 0);
        subj s;
        subj_open(&s, spec);
        for (int it = 0; it < 8; it++) {
            inst in;
            rand_inst(&rng, &in, 2 + (int)tu_below(&rng, 2),
                      1 + (long)tu_below(&rng, 400));
            check_inst(&s, &in, it == 0);
        }
        all.cases += s.cases;
        all.active += s.active;
        all.worst = s.worst > all.worst ? s.worst : all.worst;
        subj_close(&s, 0);
    }
    subj_close(&all, 1);
}

/* A hill climb over one sequence's lengths, offset and prefix towards the
 * most partial tiles (a change that loses none is kept), per spec, from
 * random starts, sizes and tilings. */
Test(pool_bound, hill_climb)
{
    static const char *const specs[] = {
        "sliding:20|causal_sliding:300", "longformer:40:9|prefix",
        "causal|prefix", "!(sliding:50)&causal&!prefix:77", "sliding:1",
        "longformer:1:9&!prefix|causal_sliding:3", "dilated:64:1|prefix:100"};
    tu_rng rng = {tu_seed() ^ 0xe0e0};
    for (int i = 0; i < 7; i++) {
        subj s;
        subj_open(&s, specs[i]);
        for (int start = 0; start < 20; start++) {
            inst in;
            rand_inst(&rng, &in, 1, 1 + (long)tu_below(&rng, 300));
            const int bm = block_sizes[tu_below(&rng, 5)];
            const int bn = block_sizes[tu_below(&rng, 5)];
            int32_t *field[4] = {in.q_len, in.k_len, in.q_off, in.prefix};
            int64_t best = check_seq(&s, &in, 0, bm, bn);
            for (int step = 0; step < 150; step++) {
                int32_t *f = field[tu_below(&rng, 4)], old = *f;
                const int hi = f == in.q_len ? in.sq
                               : f == in.k_len ? in.sk : 1 << 30;
                const long d = tu_below(&rng, 2) ? 1 + (long)tu_below(&rng, 4)
                                                 : (long)tu_below(&rng, 300);
                *f = clampi(!tu_below(&rng, 8) ? near_edge(&rng, 4000, d)
                            : tu_below(&rng, 2) ? old + d : old - d, 0, hi);
                const int64_t np = check_seq(&s, &in, 0, bm, bn);
                if (np >= best)
                    best = np;
                else
                    *f = old;
            }
        }
        subj_close(&s, 1);
    }
}

/* Leaves without boundary lines (strided columns, documents, dilation
 * above 1) may make every tile partial: the bound is every tile. */
Test(pool_bound, unbounded_leaves_every_tile)
{
    static const char *const specs[] = {"strided:33", "docs", "dilated:60:3",
                                        "causal&docs", "sliding:9|strided:64"};
    static int32_t doc[3 * 3000];
    tu_rng rng = {tu_seed() ^ 0xd0d0};
    for (int i = 0; i < 5; i++) {
        subj s;
        subj_open(&s, specs[i]);
        for (int it = 0; it < 4; it++) {
            inst in;
            rand_inst(&rng, &in, 2, 33);
            const int len = 1 + (int)tu_below(&rng, 200); /* documents */
            for (int k = 0; k < in.batch * in.sk; k++)
                doc[k] = (k % in.sk) / len;
            in.d.doc_id = doc;
            for (int t = 0; t < 25; t++) {
                const int bm = block_sizes[t / 5], bn = block_sizes[t % 5];
                cr_assert_eq(bound_of(&s, in.sq, in.sk, bm, bn),
                             (int64_t)cdiv(in.sq, bm) * cdiv(in.sk, bn),
                             "\"%s\" %dx%d tiles %dx%d", specs[i], in.sq,
                             in.sk, bm, bn);
            }
            check_inst(&s, &in, 0);
        }
        subj_close(&s, 1);
    }
}

/* sliding:W at 2000 x 2000 with the q_offset (0 .. 2 * block_n) that gives
 * the most partial tiles, at lengths 1999 and 2000: within the bound. */
Test(pool_bound, sliding_worst_offset)
{
    static const int ws[] = {1, 37, 100, 257};
    static const int tilings[][2] = {{64, 32},  {128, 64},  {16, 256},
                                     {256, 16}, {128, 128}, {16, 16}};
    for (int w = 0; w < 4; w++) {
        char spec[32];
        snprintf(spec, sizeof(spec), "sliding:%d", ws[w]);
        subj s;
        subj_open(&s, spec);
        for (int t = 0; t < 6; t++) {
            const int bm = tilings[t][0], bn = tilings[t][1];
            inst in = {.batch = 1, .sq = 2000, .sk = 2000};
            in.d.q_len = in.q_len;
            in.d.k_len = in.k_len;
            in.d.q_offset = in.q_off;
            int64_t best = -1;
            int best_off = 0, best_len = 0;
            for (int len = 1999; len <= 2000; len++)
                for (int off = 0; off <= 2 * bn; off++) {
                    in.q_len[0] = in.k_len[0] = len;
                    in.q_off[0] = off;
                    const int64_t np = check_seq(&s, &in, 0, bm, bn);
                    if (np > best) {
                        best = np;
                        best_off = off;
                        best_len = len;
                    }
                }
            cr_log_info("%s at 2000, %dx%d: most partial tiles %" PRId64
                        " (lengths %d, q_offset %d), bound %" PRId64, spec, bm,
                        bn, best, best_len, best_off,
                        bound_of(&s, 2000, 2000, bm, bn));
        }
        subj_close(&s, 1);
    }
}
