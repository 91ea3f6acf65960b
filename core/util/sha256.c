/* SHA-256 from FIPS 180-4: the portable block function follows section 6.2.2 literally; the
 * x86 one runs the same rounds with SHA-NI instructions (two rounds per sha256rnds2, message
 * schedule by sha256msg1/msg2) and is picked at run time by CPUID. */
#include "sha256.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define SHA256_HAVE_X86 1
#endif

/* FIPS 180-4 section 4.2.2: the first 32 bits of the fractional parts of the cube roots of
 * the first 64 primes. */
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static inline uint32_t rotr(uint32_t x, unsigned n) {
    return (x >> n) | (x << (32 - n));
}

static inline uint32_t load_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void blocks_portable(uint32_t st[8], const uint8_t *p, size_t nblocks) {
    for (; nblocks--; p += SHA256_BLOCK_LEN) {
        uint32_t w[64];
        for (int t = 0; t < 16; t++) w[t] = load_be32(p + 4 * t);
        for (int t = 16; t < 64; t++) {
            uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16] + s0 + w[t - 7] + s1;
        }
        uint32_t a = st[0], b = st[1], c = st[2], d = st[3];
        uint32_t e = st[4], f = st[5], g = st[6], h = st[7];
        for (int t = 0; t < 64; t++) {
            uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
            uint32_t ch = (e & f) ^ (~e & g);
            uint32_t t1 = h + S1 + ch + K[t] + w[t];
            uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
            uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
            uint32_t t2 = S0 + maj;
            h = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        st[0] += a;
        st[1] += b;
        st[2] += c;
        st[3] += d;
        st[4] += e;
        st[5] += f;
        st[6] += g;
        st[7] += h;
    }
}

#ifdef SHA256_HAVE_X86
/* sha256rnds2 keeps the working variables as two vectors, ABEF and CDGH (highest lane
 * first), and does two rounds per call with W+K taken from the low two lanes of its third
 * operand. Message words are big-endian in the input, so each 16-byte load is byte-swapped. */
__attribute__((target("sha,sse4.1,ssse3"))) static void
blocks_shani(uint32_t st[8], const uint8_t *p, size_t nblocks) {
    const __m128i bswap = _mm_set_epi8(12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3);
    __m128i dcba = _mm_loadu_si128((const __m128i *)&st[0]);
    __m128i hgfe = _mm_loadu_si128((const __m128i *)&st[4]);
    __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
    __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
    __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
    __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);

    for (; nblocks--; p += SHA256_BLOCK_LEN) {
        __m128i abef0 = abef, cdgh0 = cdgh;
        __m128i w[4]; /* the last four groups of four schedule words, w[g % 4] = group g */
        for (int g = 0; g < 16; g++) {
            if (g < 4) {
                w[g] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * g)), bswap);
            } else {
                /* W[t] = W[t-16] + s0(W[t-15]) + W[t-7] + s1(W[t-2]) for four t at once. */
                __m128i prev = w[(g - 1) % 4];
                __m128i t7 = _mm_alignr_epi8(prev, w[(g - 2) % 4], 4);
                __m128i x = _mm_add_epi32(_mm_sha256msg1_epu32(w[g % 4], w[(g - 3) % 4]), t7);
                w[g % 4] = _mm_sha256msg2_epu32(x, prev);
            }
            __m128i wk = _mm_add_epi32(w[g % 4], _mm_loadu_si128((const __m128i *)&K[4 * g]));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
        }
        abef = _mm_add_epi32(abef, abef0);
        cdgh = _mm_add_epi32(cdgh, cdgh0);
    }

    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    _mm_storeu_si128((__m128i *)&st[0], _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128((__m128i *)&st[4], _mm_alignr_epi8(dchg, feba, 8));
}

static bool cpu_has_sha(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    bool ssse3 = c & (1u << 9), sse41 = c & (1u << 19);
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return ssse3 && sse41 && (b & (1u << 29));
}
#else
static bool cpu_has_sha(void) {
    return false;
}
#endif

static int hardware = -1; /* -1: not yet asked */

bool sha256_hardware(void) {
    if (hardware < 0) hardware = cpu_has_sha();
    return hardware;
}

void sha256_set_hardware(bool on) {
    hardware = on && cpu_has_sha();
}

static void blocks(uint32_t st[8], const uint8_t *p, size_t nblocks) {
#ifdef SHA256_HAVE_X86
    if (sha256_hardware()) {
        blocks_shani(st, p, nblocks);
        return;
    }
#endif
    blocks_portable(st, p, nblocks);
}

void sha256_init(sha256_ctx *c) {
    /* Section 5.3.3: the fractional parts of the square roots of the first 8 primes. */
    static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->state, H0, sizeof H0);
    c->total = 0;
    c->used = 0;
}

void sha256_update(sha256_ctx *c, const void *data, size_t len) {
    const uint8_t *p = data;
    c->total += len;
    if (c->used) {
        size_t take = SHA256_BLOCK_LEN - c->used;
        if (take > len) take = len;
        memcpy(c->block + c->used, p, take);
        c->used += take;
        p += take;
        len -= take;
        if (c->used < SHA256_BLOCK_LEN) return;
        blocks(c->state, c->block, 1);
        c->used = 0;
    }
    size_t whole = len / SHA256_BLOCK_LEN;
    if (whole) blocks(c->state, p, whole);
    p += whole * SHA256_BLOCK_LEN;
    len -= whole * SHA256_BLOCK_LEN;
    if (len) memcpy(c->block, p, len);
    c->used = len;
}

void sha256_final(sha256_ctx *c, uint8_t out[SHA256_DIGEST_LEN]) {
    /* Section 5.1.1: a 1 bit, zeros up to 56 mod 64 bytes, the length in bits big-endian. */
    uint64_t bits = c->total * 8;
    c->block[c->used++] = 0x80;
    if (c->used > 56) {
        memset(c->block + c->used, 0, SHA256_BLOCK_LEN - c->used);
        blocks(c->state, c->block, 1);
        c->used = 0;
    }
    memset(c->block + c->used, 0, 56 - c->used);
    for (int i = 0; i < 8; i++) c->block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    blocks(c->state, c->block, 1);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->state[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->state[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->state[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->state[i];
    }
}

void sha256(const void *data, size_t len, uint8_t out[SHA256_DIGEST_LEN]) {
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, data, len);
    sha256_final(&c, out);
}

void sha256_hex(const uint8_t digest[SHA256_DIGEST_LEN], char *out) {
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < SHA256_DIGEST_LEN; i++) {
        out[2 * i] = hex[digest[i] >> 4];
        out[2 * i + 1] = hex[digest[i] & 15];
    }
    out[SHA256_HEX_LEN] = '\0';
}
