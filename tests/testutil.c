#include "testutil.h"

#include "db.h"
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

uint64_t tu_next(tu_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double tu_uniform(tu_rng *r)
{
    return (double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

uint64_t tu_below(tu_rng *r, uint64_t n)
{
    return n ? tu_next(r) % n : 0;
}

uint64_t tu_seed(void)
{
    static uint64_t seed;
    static int done;
    if (!done) {
        const char *e = getenv("STOF_TEST_SEED");
        if (e && *e) {
            seed = strtoull(e, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;
        }
        fprintf(stderr, "test seed: STOF_TEST_SEED=%llu\n",
                (unsigned long long)seed);
        done = 1;
    }
    return seed;
}

uint16_t tu_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffffu;
    if (((x >> 23) & 0xff) == 0xff)
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t h = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

float tu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ffu;
    uint32_t x;
    if (e == 0) {
        if (man == 0) {
            x = sign;
        } else {
            e = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                e--;
            }
            man &= 0x3ffu;
            x = sign | (e << 23) | (man << 13);
        }
    } else if (e == 31) {
        x = sign | 0x7f800000u | (man << 13);
    } else {
        x = sign | ((e - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t tu_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float tu_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

double tu_rel_err(const double *a, const double *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        double d = a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

uint8_t *tu_random_dense(tu_rng *r, int seq_q, int seq_k, double p)
{
    size_t n = (size_t)seq_q * (size_t)seq_k;
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return NULL;
    for (size_t i = 0; i < n; i++)
        b[i] = tu_uniform(r) < p;
    return b;
}

const char *tu_process_db(const char *name)
{
    static char path[96];
    if (!path[0])
        snprintf(path, sizeof(path), "/tmp/stof-test-%.32s-%d.db", name,
                 (int)getpid());
    return path;
}

void tu_remove_db(const char *path)
{
    char f[128];
    static const char *const ext[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        snprintf(f, sizeof(f), "%s%s", path, ext[i]);
        unlink(f);
    }
}

const char *tu_src_path(const char *rel)
{
    static char buf[4096];
    const char *root = getenv("STOF_SOURCE_ROOT");
#ifdef STOF_SOURCE_ROOT
    if (!root)
        root = STOF_SOURCE_ROOT;
#endif
    snprintf(buf, sizeof(buf), "%s/%s", root ? root : ".", rel);
    return buf;
}

stof_context *tu_open_gpu_or_skip(const stof_settings *s)
{
    stof_settings d;
    stof_default_settings(&d);
    stof_context *ctx = NULL;
    stof_status st = stof_open(&ctx, s ? s : &d);
    cr_assert_eq(st, STOF_OK, "stof_open: %s", stof_errmsg(ctx));
    if (!stof_has_device(ctx)) {
        /* The open succeeded without a device; ask again, requiring one,
         * to get the reason. */
        stof_close(&ctx);
        d.require_device = 1;
        stof_open(&ctx, &d);
        char why[512];
        snprintf(why, sizeof(why), "%s", stof_errmsg(ctx));
        stof_close(&ctx);
        cr_skip_test("no usable GPU, skipping: %s", why);
    }
    return ctx;
}

int tu_gpu_suite_main(const char *suite, int argc, char **argv)
{
    int fds[2];
    /* Criterion re-executes this program for its workers; they inherit the
     * variable and skip the probe. */
    if (!getenv("STOF_GPU_PROBED") && setenv("STOF_GPU_PROBED", "1", 1) == 0 &&
        pipe(fds) == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            stof_settings s;
            stof_default_settings(&s);
            s.require_device = 1;
            stof_context *ctx = NULL;
            stof_status st = stof_open(&ctx, &s);
            const char *msg = stof_errmsg(ctx);
            if (write(fds[1], msg, strlen(msg)) < 0)
                _exit(3);
            stof_close(&ctx);
            _exit(st == STOF_OK ? 0 : 1);
        }
        close(fds[1]);
        char why[1024] = {0};
        ssize_t n = read(fds[0], why, sizeof(why) - 1);
        (void)n;
        close(fds[0]);
        int status = 0;
        if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
            WEXITSTATUS(status) == 1) {
            printf("%s suite skipped: no usable GPU: %s\n", suite, why);
            return 77;
        }
    }
    struct criterion_test_set *tests = criterion_initialize();
    int result = 0;
    if (criterion_handle_args(argc, argv, true))
        result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    return result;
}

/* --- GPU test harness pieces (shared by the kernel suites) --------------- */

stof_mask *tu_make_mask(stof_context *ctx, const char *spec, int seq_q, int seq_k)
{
    stof_mask *m = NULL;
    if (spec[0] != '#') {
        stof_status st =
            stof_mask_from_spec(ctx, spec, seq_q, seq_k, &m);
        cr_assert_eq(st, STOF_OK, "mask %s: %s", spec, stof_errmsg(ctx));
        return m;
    }
    uint8_t *b = calloc((size_t)seq_q * (size_t)seq_k, 1);
    cr_assert(b);
    for (int i = 0; i < seq_q; i++) {
        uint8_t *row = b + (size_t)i * (size_t)seq_k;
        if (strcmp(spec, "#single") == 0)
            row[(7 * i + 3) % seq_k] = 1;
        else if (strcmp(spec, "#lastcol") == 0)
            row[seq_k - 1] = 1;
        else if (strcmp(spec, "#halfempty") == 0)
            memset(row, i % 2 == 0, (size_t)seq_k);
        else if (strcmp(spec, "#colsparse") == 0) {
            for (int j = 0; j < seq_k && i % 13 != 0; j++)
                row[j] = (uint8_t)((j * 7 + i / 5) % 11 == 0);
        }
        else
            cr_assert_fail("unknown generated mask %s", spec);
    }
    stof_status st = stof_mask_from_dense(ctx, b, seq_q, seq_k, &m);
    free(b);
    cr_assert_eq(st, STOF_OK, "mask %s: %s", spec, stof_errmsg(ctx));
    return m;
}

/* The mask a QPERM format is built on: m's rows grouped by residue class
 * when m has a row period (dilated), else shuffled; row r of the result is
 * row (*perm)[r] of m. */
stof_mask *tu_permuted_mask(stof_context *ctx, const stof_mask *m,
                                tu_rng *rng, int32_t **perm, int *period)
{
    stof_mask *g = NULL;
    *period = stof__mask_row_period(m);
    if (*period > 1) {
        cr_assert_eq(stof__mask_group_rows(ctx, m, *period, &g, perm),
                     STOF_OK, "%s", stof_errmsg(ctx));
        return g;
    }
    const int sq = stof_mask_seq_q(m), sk = stof_mask_seq_k(m);
    int32_t *p = malloc(sizeof(int32_t) * (size_t)sq);
    uint8_t *dense = malloc((size_t)sq * (size_t)sk),
            *pd = malloc((size_t)sq * (size_t)sk);
    cr_assert(p && dense && pd);
    for (int i = 0; i < sq; i++)
        p[i] = i;
    for (int i = sq - 1; i > 0; i--) {
        const int j = (int)tu_below(rng, (uint64_t)i + 1u);
        const int32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    stof_mask_to_dense(m, dense);
    for (int i = 0; i < sq; i++)
        memcpy(pd + (size_t)i * sk, dense + (size_t)p[i] * sk, (size_t)sk);
    cr_assert_eq(stof_mask_from_dense(ctx, pd, sq, sk, &g), STOF_OK);
    free(dense);
    free(pd);
    *perm = p;
    return g;
}

size_t tu_tensor_elems(const int64_t st[3], int b, int h, int s, int d)
{
    return (size_t)((b - 1) * st[0] + (h - 1) * st[1] +
                    (int64_t)(s - 1) * st[2] + d);
}

void tu_fill_random(tu_rng *r, uint16_t *raw, float *f, size_t n,
                        stof_dtype dt, float amp)
{
    for (size_t i = 0; i < n; i++) {
        float x = (float)(tu_uniform(r) * 2.0 - 1.0) * amp;
        raw[i] = dt == STOF_DTYPE_FP16 ? tu_f32_to_f16(x) : tu_f32_to_bf16(x);
        f[i] = dt == STOF_DTYPE_FP16 ? tu_f16_to_f32(raw[i])
                                     : tu_bf16_to_f32(raw[i]);
    }
}

void tu_make_desc(stof_attention_desc *d, int batch, int heads, int seq_q,
                  int seq_k, int head_dim, stof_dtype dt, stof_layout layout,
                  int pad)
{
    cr_assert_eq(stof_attention_desc_init(d, batch, heads, seq_q,
                                          seq_k, head_dim, dt,
                                          layout == STOF_LAYOUT_STRIDED
                                              ? STOF_LAYOUT_BSHD
                                              : layout),
                 STOF_OK);
    if (layout == STOF_LAYOUT_STRIDED) {
        /* BSHD with padded rows, a different pad for k/v. */
        int64_t row = (int64_t)heads * (head_dim + pad);
        d->layout = STOF_LAYOUT_STRIDED;
        d->q_stride[2] = d->o_stride[2] = row;
        d->q_stride[1] = d->o_stride[1] = head_dim + pad;
        d->q_stride[0] = d->o_stride[0] = row * seq_q;
        int64_t krow = (int64_t)heads * (head_dim + 2 * pad);
        d->k_stride[2] = d->v_stride[2] = krow;
        d->k_stride[1] = d->v_stride[1] = head_dim + 2 * pad;
        d->k_stride[0] = d->v_stride[0] = krow * seq_k;
    }
}


void tu_record_fill(stof_db_record *r, uint64_t seed, size_t cubin_size)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->key, sizeof(r->key), "%032llx", (unsigned long long)seed);
    snprintf(r->op, sizeof(r->op), "attention");
    snprintf(r->mask_digest, sizeof(r->mask_digest), "%032llx",
             (unsigned long long)(seed * 7));
    snprintf(r->mask_spec, sizeof(r->mask_spec), "sliding:%d",
             64 * (int)(seed % 64 + 1));
    r->batch = 1;
    r->heads = 8;
    r->seq_q = r->seq_k = 4096;
    r->head_dim = 64;
    snprintf(r->dtype, sizeof(r->dtype), "fp16");
    snprintf(r->layout, sizeof(r->layout), "BHSD");
    snprintf(r->device_name, sizeof(r->device_name), "NVIDIA H100 80GB HBM3");
    r->cc_major = 9;
    r->sm_count = 132;
    r->driver_version = 13000;
    snprintf(r->nvrtc_version, sizeof(r->nvrtc_version), "13.0");
    snprintf(r->stof_version, sizeof(r->stof_version), "%s",
             stof_version_string());
    snprintf(r->template_hash, sizeof(r->template_hash), "%016llx",
             (unsigned long long)stof_template_hash());
    snprintf(r->kernel, sizeof(r->kernel), "block");
    snprintf(r->config, sizeof(r->config),
             "{\"kind\":\"block\",\"block_m\":64,\"block_n\":64,"
             "\"warps\":4,\"stages\":2,\"overlap\":0,\"group\":0}");
    snprintf(r->arch, sizeof(r->arch), "sm_90");
    r->time_ms = 0.25 + (double)(seed % 100) / 64.0;
    r->runner_up_ms = r->time_ms * 1.25;
    r->model_ms = r->time_ms * 1.5;
    r->n_candidates = 6;
    r->verified = 1;
    snprintf(r->measured, sizeof(r->measured), "{\"seed\":%llu}",
             (unsigned long long)seed);
    r->created_at = 1700000000 + (int64_t)(seed % 100000);
    snprintf(r->host, sizeof(r->host), "host-%llu", (unsigned long long)seed);
    if (cubin_size) {
        unsigned char *b = malloc(cubin_size);
        cr_assert_not_null(b);
        tu_rng g = {seed};
        for (size_t i = 0; i < cubin_size; i++)
            b[i] = (unsigned char)tu_next(&g);
        r->cubin = b;
        r->cubin_size = cubin_size;
    }
    stof__db_record_hash(r, r->content_hash);
}

void tu_lse_ref(const stof_attention_desc *d, const stof_mask *m,
                const float *fq, const float *fk, double *want)
{
    tu_lse_ref_bias(d, m, fq, fk, NULL, want);
}

void tu_lse_ref_bias(const stof_attention_desc *d, const stof_mask *m,
                     const float *fq, const float *fk, const float *bias,
                     double *want)
{
    const int G = d->heads / (d->kv_heads > 0 ? d->kv_heads : d->heads);
    const double scale = d->scale != 0.0f ? (double)d->scale
                                          : 1.0 / sqrt((double)d->head_dim);
    double *sc = malloc(sizeof(double) * (size_t)d->seq_k);
    cr_assert(sc, "out of memory");
    for (int b = 0; b < d->batch; b++)
        for (int h = 0; h < d->heads; h++)
            for (int i = 0; i < d->seq_q; i++) {
                const float *qr = fq + b * d->q_stride[0] +
                                  h * d->q_stride[1] + i * d->q_stride[2];
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j < d->seq_k; j++) {
                    sc[j] = -INFINITY;
                    if (!stof_mask_get(m, i, j))
                        continue;
                    const float *kr = fk + b * d->k_stride[0] +
                                      (h / G) * d->k_stride[1] +
                                      j * d->k_stride[2];
                    double acc = 0.0;
                    for (int c = 0; c < d->head_dim; c++)
                        acc += (double)qr[c] * kr[c];
                    acc *= scale;
                    if (d->softcap > 0.0f)
                        acc = d->softcap * tanh(acc / d->softcap);
                    if (d->alibi_slopes)
                        acc += (double)d->alibi_slopes[h] * (j - i);
                    if (bias) {
                        const float bv = bias[b * d->bias_stride[0] +
                                              h * d->bias_stride[1] +
                                              i * d->bias_stride[2] + j];
                        if (stof__bias_masks(bv))
                            continue;
                        acc += bv;
                    }
                    sc[j] = acc;
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j < d->seq_k; j++)
                    if (sc[j] > -INFINITY)
                        sum += exp(sc[j] - mx);
                want[((size_t)b * d->heads + h) * d->seq_q + i] =
                    sum > 0 ? mx + log(sum) : -INFINITY;
            }
    free(sc);
}

double tu_out_rel_err(const stof_attention_desc *d, const uint16_t *ho,
                      const float *fo, int b0, int nb)
{
    double num = 0.0, den = 0.0;
    for (int b = b0; b < b0 + nb; b++)
        for (int h = 0; h < d->heads; h++)
            for (int s = 0; s < d->seq_q; s++)
                for (int x = 0; x < d->head_dim; x++) {
                    const int64_t o = b * d->o_stride[0] + h * d->o_stride[1] +
                                      s * d->o_stride[2] + x;
                    const double g = d->dtype == STOF_DTYPE_FP16
                                         ? tu_f16_to_f32(ho[o])
                                         : tu_bf16_to_f32(ho[o]);
                    const double w = fo[o];
                    if (!isfinite(g) || !isfinite(w))
                        return INFINITY;
                    num += (g - w) * (g - w);
                    den += w * w;
                }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

const char *tu_sync_error(void)
{
    const stof_api *api = stof__api();
    const CUresult r = api->cuCtxSynchronize();
    if (r == CUDA_SUCCESS)
        return NULL;
    const char *name = NULL;
    if (api->cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
        name = "an unknown CUDA error";
    return name;
}
