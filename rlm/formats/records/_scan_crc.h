/* CRC-32C for the compiled scan (rlm/formats/records/_scan.c, docs/scan.md): included once, by it.
 *
 * crc32c(crc, p, n) continues a CRC-32C (Kafka's v2 batch checksum) over n bytes; crc_init() must
 * run first (tables, folding constants, which CPU path). crc_raw_* work on the raw register.
 */
#ifndef RLM_SCAN_CRC_H
#define RLM_SCAN_CRC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* RLM_SCAN_PORTABLE: build only the table path (how other architectures build; for testing it) */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(RLM_SCAN_PORTABLE)
#define RLM_X86 1
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------------------------------------
 * CRC-32C (Castagnoli, reflected polynomial 0x82F63B78). The functions below work on the raw
 * register; crc32c() applies Kafka's (and every implementation's) ~ before and after.
 */
#define POLY 0x82F63B78u
static uint32_t crc_table[8][256];

static void crc_table_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

/* Slicing-by-8: the portable fallback (CPUs without SSE4.2, other architectures). */
static uint32_t crc_raw_table(uint32_t crc, const uint8_t *p, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff]
              ^ crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff]
              ^ crc_table[2][(w >> 40) & 0xff] ^ crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
#endif
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

/* ---------------------------------------------------------------------------------------------
 * Combining: crc32c_combine(c1, c2, n) is the CRC-32C of A + B from c1 = CRC-32C(A), c2 =
 * CRC-32C(B) and n = len(B) in bytes (zlib's crc32_combine for this polynomial): c1 times
 * x^(8n) mod P, plus c2. Portable (no CPU feature): a few hundred shifts per call, so a segment's
 * CRC is combined from its batches' verified CRCs for the cost of their 21-byte headers.
 */
static uint32_t x2n_table[32]; /* x^(2^k) mod P, reflected */

static uint32_t multmodp(uint32_t a, uint32_t b)
{
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

static void combine_init(void)
{
    uint32_t p = 1u << 30; /* x^1 */
    x2n_table[0] = p;
    for (int k = 1; k < 32; k++)
        x2n_table[k] = p = multmodp(p, p);
}

/* x^(8n) mod P: the operator moving a CRC over n zero bytes. */
static uint32_t x8nmodp(uint64_t n)
{
    uint32_t p = 1u << 31; /* x^0 */
    for (unsigned k = 3; n; n >>= 1, k++)
        if (n & 1)
            p = multmodp(x2n_table[k & 31], p);
    return p;
}

static uint32_t crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
{
    return len2 ? multmodp(x8nmodp(len2), crc1) ^ crc2 : crc1;
}

#ifdef RLM_X86
/* x^e mod P, reflected (bit 31 is x^0). */
static uint32_t xpow_mod(unsigned e)
{
    uint32_t v = 0x80000000u;
    while (e--)
        v = (v & 1) ? (v >> 1) ^ POLY : v >> 1;
    return v;
}

/* Two hardware paths, picked at import by what the CPU has (measured on the 2-core EPYC of
 * BENCHMARKS.md, 13.5 KiB inputs: one crc32 chain 4-10 GB/s, three chains 12-29, the AVX-512
 * fold 35-61; the machine is shared, hence the ranges).
 *
 * SSE4.2: the crc32 instruction has a latency of 3 cycles and a throughput of 1 per cycle, so
 * three chains over adjacent blocks of L bytes run in parallel; they are joined by shifting a
 * register over the bytes after it: r * x^(8n) mod P is one carry-less multiply by
 * x^(8n-33) mod P and one crc32 of the 64-bit product (which reduces it and supplies the x^33).
 *
 * AVX-512 + VPCLMULQDQ: Intel's "Fast CRC Computation Using PCLMULQDQ" folding, 4 x 64 bytes per
 * step. Each 128-bit lane holds, modulo P, the bytes of its lane so far; moving it forward by F
 * bits is lo64 * (x^(F+31) mod P) ^ hi64 * (x^(F-33) mod P) (32-bit reflected constants: the
 * product lands 33 bits off). The final 16-byte remainder has the CRC of the prefix it stands for,
 * so the crc32 instruction finishes it and the tail. */
#define N_LEVELS 3
static const size_t LEVELS[N_LEVELS] = {4096, 512, 64};
static uint64_t K1[N_LEVELS], K2[N_LEVELS]; /* shift over L and over 2L bytes */
static int have_hw = 0, have_fold = 0;
static uint64_t KF[3][2];                   /* fold by 2048, 512, 128 bits: {lo, hi} */

__attribute__((target("sse4.2,pclmul"))) static inline uint32_t shift_hw(uint32_t r, uint64_t k)
{
    __m128i prod = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)r), _mm_cvtsi64_si128((long long)k), 0);
    return (uint32_t)_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(prod));
}

__attribute__((target("sse4.2"))) static uint64_t crc_tail_hw(uint64_t c, const uint8_t *p, size_t n)
{
    while (n >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c = _mm_crc32_u64(c, a);
        p += 8;
        n -= 8;
    }
    uint32_t r = (uint32_t)c;
    while (n--)
        r = _mm_crc32_u8(r, *p++);
    return r;
}

__attribute__((target("sse4.2,pclmul"))) static uint32_t crc_raw_hw(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c0 = crc;
    for (int lv = 0; lv < N_LEVELS; lv++) {
        const size_t L = LEVELS[lv];
        while (n >= 3 * L) {
            uint64_t c1 = 0, c2 = 0;
            const uint8_t *stop = p + L;
            do {
                uint64_t a, b, c;
                memcpy(&a, p, 8);
                memcpy(&b, p + L, 8);
                memcpy(&c, p + 2 * L, 8);
                c0 = _mm_crc32_u64(c0, a);
                c1 = _mm_crc32_u64(c1, b);
                c2 = _mm_crc32_u64(c2, c);
                p += 8;
            } while (p < stop);
            c0 = shift_hw((uint32_t)c0, K2[lv]) ^ shift_hw((uint32_t)c1, K1[lv]) ^ (uint32_t)c2;
            p += 2 * L;
            n -= 3 * L;
        }
    }
    return (uint32_t)crc_tail_hw(c0, p, n);
}

#define FOLD_TARGET __attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq")))
#define FOLD_MIN 256

FOLD_TARGET static inline __m512i fold512(__m512i x, __m512i k, __m512i d)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11), d,
                                     0x96); /* a ^ b ^ c */
}

FOLD_TARGET static inline __m128i fold128(__m128i x, __m128i k, __m128i d)
{
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), d);
}

FOLD_TARGET static uint32_t crc_raw_fold(uint32_t crc, const uint8_t *p, size_t n)
{
    if (n < FOLD_MIN)
        return (uint32_t)crc_tail_hw(crc, p, n);
    const __m512i k2048 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)KF[0]));
    const __m512i k512 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)KF[1]));
    const __m128i k128 = _mm_loadu_si128((const __m128i *)KF[2]);
    __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)crc)));
    __m512i x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
    for (p += 256, n -= 256; n >= 256; p += 256, n -= 256) {
        x0 = fold512(x0, k2048, _mm512_loadu_si512(p));
        x1 = fold512(x1, k2048, _mm512_loadu_si512(p + 64));
        x2 = fold512(x2, k2048, _mm512_loadu_si512(p + 128));
        x3 = fold512(x3, k2048, _mm512_loadu_si512(p + 192));
    }
    x0 = fold512(fold512(fold512(x0, k512, x1), k512, x2), k512, x3);
    for (; n >= 64; p += 64, n -= 64)
        x0 = fold512(x0, k512, _mm512_loadu_si512(p));
    __m128i x = fold128(_mm512_extracti32x4_epi32(x0, 0), k128, _mm512_extracti32x4_epi32(x0, 1));
    x = fold128(x, k128, _mm512_extracti32x4_epi32(x0, 2));
    x = fold128(x, k128, _mm512_extracti32x4_epi32(x0, 3));
    for (; n >= 16; p += 16, n -= 16)
        x = fold128(x, k128, _mm_loadu_si128((const __m128i *)p));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(x, 1));
    return (uint32_t)crc_tail_hw(c, p, n);
}
#endif

static uint32_t crc32c(uint32_t crc, const uint8_t *p, size_t n)
{
#ifdef RLM_X86
    if (have_fold)
        return ~crc_raw_fold(~crc, p, n);
    if (have_hw)
        return ~crc_raw_hw(~crc, p, n);
#endif
    return ~crc_raw_table(~crc, p, n);
}

static void crc_init(void)
{
    crc_table_init();
    combine_init();
#ifdef RLM_X86
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul");
    have_fold = have_hw && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
    for (int lv = 0; lv < N_LEVELS; lv++) {
        K1[lv] = xpow_mod((unsigned)(8 * LEVELS[lv] - 33));
        K2[lv] = xpow_mod((unsigned)(16 * LEVELS[lv] - 33));
    }
    const unsigned bits[3] = {2048, 512, 128};
    for (int i = 0; i < 3; i++) {
        KF[i][0] = xpow_mod(bits[i] + 31);
        KF[i][1] = xpow_mod(bits[i] - 33);
    }
#endif
}

#endif /* RLM_SCAN_CRC_H */
