/*
 * mask.c - the bit-packed attention mask: allocation, packing from dense
 * bytes, accessors, the canonical digest and unpacking.
 *
 * A mask row holds words_per_row = ceil(seq_k / 64) 64-bit words; key k of
 * row q is bit k % 64 of word k / 64 of that row. Bits past seq_k are always
 * zero, so that whole-word operations (popcounts, digests, comparisons) need
 * no special case for the last word.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Counting the allowed elements is a popcount over the whole mask.
 * Baseline x86-64 has no popcount instruction (__builtin_popcountll becomes
 * a slow library call), so on x86-64 ELF targets count_bits() is compiled
 * twice and the loader picks the popcnt version on CPUs that have it;
 * elsewhere a SWAR popcount (or the builtin, where the target has the
 * instruction) is used. */
#if defined(__x86_64__) && defined(__ELF__) && defined(__GLIBC__) &&           \
    !defined(__POPCNT__) &&                                                    \
    ((defined(__clang__) && __clang_major__ >= 14) ||                          \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 7))
#define MASK_CLONES __attribute__((target_clones("popcnt", "default")))
#define POPCNT(x) __builtin_popcountll(x)
#else
#define MASK_CLONES
#define POPCNT(x) popcount64(x)
static inline int popcount64(uint64_t x)
{
#if defined(__POPCNT__) || defined(__aarch64__)
    return __builtin_popcountll(x);
#else
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (int)((x * 0x0101010101010101ull) >> 56);
#endif
}
#endif

/* The number of set bits in n words. */
MASK_CLONES
static uint64_t count_bits(const uint64_t *b, size_t n)
{
    uint64_t c0 = 0, c1 = 0;
    size_t i = 0;
    /* Two accumulators let two popcounts issue per cycle. */
    for (; i + 2 <= n; i += 2) {
        c0 += (uint64_t)POPCNT(b[i]);
        c1 += (uint64_t)POPCNT(b[i + 1]);
    }
    for (; i < n; i++)
        c0 += (uint64_t)POPCNT(b[i]);
    return c0 + c1;
}

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define XXH_INLINE_ALL
#include <xxhash.h>

#define MASK_MAX_SEQ 1048576

/* The tag that starts the digested byte stream. Changing the layout of the
 * stream means changing this tag, so old and new digests never collide. */
static const char mask_digest_tag[8] = {'S', 'T', 'O', 'F', 'M', 'S', 'K', '1'};

#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) &&            \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define MASK_LITTLE_ENDIAN 1
#else
#define MASK_LITTLE_ENDIAN 0
#endif

stof_status stof__mask_alloc(stof_context *ctx, int seq_q, int seq_k,
                             stof_mask **out)
{
    if (!out)
        return stof__fail(ctx, STOF_ERR_INTERNAL,
                          "stof__mask_alloc: out is NULL");
    *out = NULL;
    if (seq_q < 1 || seq_q > MASK_MAX_SEQ || seq_k < 1 || seq_k > MASK_MAX_SEQ)
        return stof__fail(ctx, STOF_ERR_INVALID_ARGUMENT,
                          "mask size %d x %d: seq_q and seq_k must be 1..%d",
                          seq_q, seq_k, MASK_MAX_SEQ);
    size_t wpr = ((size_t)seq_k + 63) / 64;
    /* seq_q * wpr * 8 must fit in size_t (it does on 64-bit hosts; this
     * guards 32-bit ones). */
    if ((size_t)seq_q > SIZE_MAX / 8 / wpr)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "mask %d x %d: %llu words do not fit in memory", seq_q,
                          seq_k,
                          (unsigned long long)seq_q * (unsigned long long)wpr);
    stof_mask *m = calloc(1, sizeof(*m));
    if (!m)
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory allocating a mask header");
    m->bits = calloc((size_t)seq_q * wpr, sizeof(uint64_t));
    if (!m->bits) {
        free(m);
        return stof__fail(ctx, STOF_ERR_OUT_OF_MEMORY,
                          "out of memory allocating a %d x %d mask (%zu bytes)",
                          seq_q, seq_k, (size_t)seq_q * wpr * sizeof(uint64_t));
    }
    m->seq_q = seq_q;
    m->seq_k = seq_k;
    m->words_per_row = (int)wpr;
    m->count = 0;
    *out = m;
    return STOF_OK;
}

void stof__mask_recount(stof_mask *m)
{
    if (!m)
        return;
    m->count = count_bits(m->bits, (size_t)m->seq_q * (size_t)m->words_per_row);
    stof__mask_seal(m);
}

static uint64_t load_u64(const uint8_t *p)
{
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

/* Eight bytes (little-endian load) -> eight bits: bit i says whether byte i
 * is nonzero. The OR cascade folds each byte into its lowest bit; the
 * multiply then gathers the eight lowest bits into the top byte (the magic
 * constant places byte i's bit at position 56 + i, with no carries). */
static unsigned pack8(uint64_t x)
{
    x |= x >> 4;
    x |= x >> 2;
    x |= x >> 1;
    x &= 0x0101010101010101ull;
    return (unsigned)((x * 0x0102040810204080ull) >> 56);
}

/* Pack 64 bytes into one word: bit i = (p[i] != 0). */
static uint64_t pack64(const uint8_t *p)
{
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128();
    uint64_t w = 0;
    for (int i = 0; i < 4; i++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i));
        unsigned z = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero));
        w |= (uint64_t)(~z & 0xffffu) << (16 * i);
    }
    return w;
#else
    uint64_t w = 0;
    for (int i = 0; i < 8; i++) {
#if MASK_LITTLE_ENDIAN
        w |= (uint64_t)pack8(load_u64(p + 8 * i)) << (8 * i);
#else
        for (int j = 0; j < 8; j++)
            w |= (uint64_t)(p[8 * i + j] != 0) << (8 * i + j);
#endif
    }
    return w;
#endif
}

/* Pack n < 64 trailing bytes. */
static uint64_t pack_tail(const uint8_t *p, int n)
{
    uint64_t w = 0;
    int i = 0;
#if MASK_LITTLE_ENDIAN
    for (; i + 8 <= n; i += 8)
        w |= (uint64_t)pack8(load_u64(p + i)) << i;
#endif
    for (; i < n; i++)
        w |= (uint64_t)(p[i] != 0) << i;
    return w;
}

/* The arguments every constructor from caller memory checks: the output
 * pointer (cleared), the input and the sizes, named as `fn` names them. */
static stof_status check_made_from(stof_context *ctx, const char *fn,
                                   const char *what, const void *in,
                                   int seq_q, int seq_k, stof_mask **mask)
{
    STOF_CHECK_ARG(ctx, mask != NULL, "%s: mask is NULL", fn);
    *mask = NULL;
    STOF_CHECK_ARG(ctx, in != NULL, "%s: %s is NULL", fn, what);
    STOF_CHECK_ARG(ctx, seq_q >= 1 && seq_q <= MASK_MAX_SEQ,
                   "%s: seq_q = %d, expected 1..%d", fn, seq_q, MASK_MAX_SEQ);
    STOF_CHECK_ARG(ctx, seq_k >= 1 && seq_k <= MASK_MAX_SEQ,
                   "%s: seq_k = %d, expected 1..%d", fn, seq_k, MASK_MAX_SEQ);
    return STOF_OK;
}

stof_status stof_mask_from_dense(stof_context *ctx, const uint8_t *bytes,
                                 int seq_q, int seq_k, stof_mask **mask)
{
    stof_status st = check_made_from(ctx, "stof_mask_from_dense", "bytes",
                                     bytes, seq_q, seq_k, mask);
    if (st != STOF_OK)
        return st;
    stof_mask *m;
    st = stof__mask_alloc(ctx, seq_q, seq_k, &m);
    if (st != STOF_OK)
        return st;
    const int wpr = m->words_per_row;
    const int full_words = seq_k / 64;
    const int tail = seq_k % 64;
    uint64_t count = 0;
    for (int q = 0; q < seq_q; q++) {
        const uint8_t *src = bytes + (size_t)q * (size_t)seq_k;
        uint64_t *dst = m->bits + (size_t)q * (size_t)wpr;
        for (int w = 0; w < full_words; w++)
            dst[w] = pack64(src + 64 * (size_t)w);
        if (tail)
            dst[full_words] = pack_tail(src + 64 * (size_t)full_words, tail);
        /* Counted per row while the row is still in cache. */
        count += count_bits(dst, (size_t)wpr);
    }
    m->count = count;
    stof__mask_seal(m);
    *mask = m;
    return stof__ok(ctx);
}

stof_status stof_mask_from_bits(stof_context *ctx, const uint8_t *bits,
                                size_t row_bytes, int seq_q, int seq_k,
                                stof_mask **mask)
{
    stof_status st = check_made_from(ctx, "stof_mask_from_bits", "bits", bits,
                                     seq_q, seq_k, mask);
    if (st != STOF_OK)
        return st;
    const size_t need = ((size_t)seq_k + 7) / 8;
    STOF_CHECK_ARG(ctx, row_bytes >= need,
                   "stof_mask_from_bits: row_bytes = %zu, a row of %d keys "
                   "takes at least %zu", row_bytes, seq_k, need);
    stof_mask *m;
    st = stof__mask_alloc(ctx, seq_q, seq_k, &m);
    if (st != STOF_OK)
        return st;
    const int wpr = m->words_per_row;
    const int tail = seq_k % 64;
    uint64_t count = 0;
    for (int q = 0; q < seq_q; q++) {
        const uint8_t *src = bits + (size_t)q * row_bytes;
        uint64_t *dst = m->bits + (size_t)q * (size_t)wpr;
        for (int w = 0; w < wpr; w++) {
            /* The bytes of this word that lie within the row's need. */
            size_t at = 8 * (size_t)w;
            size_t n = need - at < 8 ? need - at : 8;
            uint64_t x = 0;
#if MASK_LITTLE_ENDIAN
            if (n == 8)
                x = load_u64(src + at);
            else
#endif
                for (size_t i = 0; i < n; i++)
                    x |= (uint64_t)src[at + i] << (8 * i);
            dst[w] = x;
        }
        /* Bits past seq_k stay zero (the words' invariant). */
        if (tail)
            dst[wpr - 1] &= (1ull << tail) - 1;
        count += count_bits(dst, (size_t)wpr);
    }
    m->count = count;
    stof__mask_seal(m);
    *mask = m;
    return stof__ok(ctx);
}

void stof_mask_free(stof_mask **mask)
{
    if (!mask || !*mask)
        return;
    free((*mask)->bits);
    free((*mask)->spec);
    free(*mask);
    *mask = NULL;
}

int stof_mask_seq_q(const stof_mask *m)
{
    return m ? m->seq_q : 0;
}

int stof_mask_seq_k(const stof_mask *m)
{
    return m ? m->seq_k : 0;
}

uint64_t stof_mask_count(const stof_mask *m)
{
    return m ? m->count : 0;
}

double stof_mask_density(const stof_mask *m)
{
    if (!m)
        return 0.0;
    return (double)m->count / ((double)m->seq_q * (double)m->seq_k);
}

int stof_mask_get(const stof_mask *m, int q, int k)
{
    if (!m || q < 0 || q >= m->seq_q || k < 0 || k >= m->seq_k)
        return 0;
    uint64_t w = m->bits[(size_t)q * (size_t)m->words_per_row + (size_t)k / 64];
    return (int)((w >> (k % 64)) & 1u);
}

static void put_le64(uint8_t *p, uint64_t x)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}

/* The digest covers the tag, seq_q and seq_k (little-endian u64) and every
 * row's words as little-endian u64, padding bits included (they are zero),
 * fed to one streaming XXH3-128 state so no copy of the mask is made. */
static void compute_digest(const stof_mask *m, uint64_t *hi_out,
                           uint64_t *lo_out)
{
    uint64_t hi = 0, lo = 0;
    {
        XXH3_state_t st;
        XXH3_INITSTATE(&st);
        XXH3_128bits_reset(&st);
        uint8_t head[24];
        memcpy(head, mask_digest_tag, 8);
        put_le64(head + 8, (uint64_t)m->seq_q);
        put_le64(head + 16, (uint64_t)m->seq_k);
        XXH3_128bits_update(&st, head, sizeof(head));
        size_t n = (size_t)m->seq_q * (size_t)m->words_per_row;
#if MASK_LITTLE_ENDIAN
        XXH3_128bits_update(&st, m->bits, n * sizeof(uint64_t));
#else
        uint8_t buf[8 * 256];
        for (size_t i = 0; i < n;) {
            size_t c = n - i < 256 ? n - i : 256;
            for (size_t j = 0; j < c; j++)
                put_le64(buf + 8 * j, m->bits[i + j]);
            XXH3_128bits_update(&st, buf, c * 8);
            i += c;
        }
#endif
        XXH128_hash_t h = XXH3_128bits_digest(&st);
        hi = h.high64;
        lo = h.low64;
    }
    *hi_out = hi;
    *lo_out = lo;
}

void stof__mask_seal(stof_mask *m)
{
    compute_digest(m, &m->digest[0], &m->digest[1]);
    m->sealed = 1;
}

void stof_mask_digest(const stof_mask *m, uint64_t digest[2], char hex[33])
{
    uint64_t hi = 0, lo = 0;
    if (m && m->sealed) {
        hi = m->digest[0];
        lo = m->digest[1];
    } else if (m) {
        compute_digest(m, &hi, &lo);
    }
    if (digest) {
        digest[0] = hi;
        digest[1] = lo;
    }
    if (hex)
        snprintf(hex, 33, "%016llx%016llx", (unsigned long long)hi,
                 (unsigned long long)lo);
}

void stof_mask_to_dense(const stof_mask *m, uint8_t *bytes)
{
    if (!m || !bytes)
        return;
    const int wpr = m->words_per_row;
    for (int q = 0; q < m->seq_q; q++) {
        const uint64_t *src = m->bits + (size_t)q * (size_t)wpr;
        uint8_t *dst = bytes + (size_t)q * (size_t)m->seq_k;
        for (int w = 0; w < wpr; w++) {
            uint64_t x = src[w];
            int base = 64 * w;
            int n = m->seq_k - base < 64 ? m->seq_k - base : 64;
            for (int i = 0; i < n; i++)
                dst[base + i] = (uint8_t)((x >> i) & 1u);
        }
    }
}
