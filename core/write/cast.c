/* convert --dtype: float tensors rounded to F32, F16 or BF16 (to nearest, ties to even, as
 * numpy's astype does), read through a virtual source that converts as it is read, so every
 * writer sees plain tensors of the new dtype. */
#include "cast.h"

#include "../model/catalog.h"
#include "../util/cpu.h"
#include "../read/dequant.h"
#include "../util/search.h"
#include "writers/writers.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CHUNK_ELEMS = 1 << 20 };

static bool is_float(ckpt_dtype dt) {
    return dt == CKPT_F64 || dt == CKPT_F32 || dt == CKPT_F16 || dt == CKPT_BF16 ||
           dt == CKPT_F8_E4M3 || dt == CKPT_F8_E5M2;
}

bool ckpt_cast_applies(ckpt_dtype from, ckpt_dtype to, bool quantized) {
    if (from == to) return false;
    if (is_float(from)) return true;
    return quantized && from >= CKPT_Q4_0 && ckpt_to_f32_supported(from);
}

uint32_t ckpt_round_float(double x, int mbits, int ebits) {
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    uint32_t sign = (uint32_t)(b >> 63) << (mbits + ebits);
    uint32_t exp_all = (1u << ebits) - 1, inf = sign | exp_all << mbits;
    if (isnan(x)) {
        uint32_t payload = (uint32_t)((b & ((1ull << 52) - 1)) >> (52 - mbits));
        return inf | 1u << (mbits - 1) | payload;
    }
    if (isinf(x)) return inf;
    double a = fabs(x);
    if (a == 0) return sign;
    int e;
    frexp(a, &e);
    int bias = (1 << (ebits - 1)) - 1, E = e - 1, emin = 1 - bias;
    /* The value as an integer count of the target's quantum at this magnitude: the scaling is
     * by a power of two, exact, and nearbyint rounds ties to even in the default mode. */
    int quantum = (E < emin ? emin : E) - mbits;
    uint64_t m = (uint64_t)nearbyint(ldexp(a, -quantum));
    if (E < emin) return sign | (uint32_t)m; /* subnormal; 2^mbits carries into the exponent */
    if (m == 1ull << (mbits + 1)) {
        m >>= 1;
        E++;
    }
    if (E + bias >= (int)exp_all) return inf;
    return sign | (uint32_t)(E + bias) << mbits | (uint32_t)(m - (1ull << mbits));
}

/* One chunk of whole blocks as floats (every source dtype but F64, whose values a float may not
 * hold). */
static void decode_f32(ckpt_dtype dt, const unsigned char *src, size_t nblocks, float *f32) {
    if (dt == CKPT_F32)
        memcpy(f32, src, nblocks * sizeof *f32);
    else
        ckpt_to_f32(dt, src, nblocks, f32);
}

/* The float conversions below give what ckpt_round_float gives for a float's value (an
 * exhaustive comparison over all 2^32 patterns is in tests/unit/cast.c), on its bits: the
 * general routine goes through frexp/ldexp/nearbyint, ~17 ns a value. */
uint32_t ckpt_f32_to_f32(uint32_t u) {
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? u | 0x400000u : u; /* NaN: quiet */
}

uint16_t ckpt_f32_to_bf16(uint32_t u) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)(u >> 16 | 0x40); /* NaN: quiet */
    return (uint16_t)((u + 0x7FFFu + (u >> 16 & 1)) >> 16); /* ties to even; may carry to inf */
}

uint16_t ckpt_f32_to_f16(uint32_t u) {
    uint16_t sign = (uint16_t)(u >> 16 & 0x8000);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00 | (uint16_t)(a >> 13 & 0x3FF); /* NaN: quiet */
    if (a >= 0x477FF000u) return sign | 0x7C00; /* 65520 and up: the tie above 65504 is odd */
    if (a >= 0x38800000u) {                     /* normal in F16: rebias, round off 13 bits */
        a += 0xFFFu + (a >> 13 & 1);
        return sign | (uint16_t)((a - 0x38000000u) >> 13);
    }
    if (a <= 0x33000000u) return sign; /* at most half the least subnormal (2^-25): to zero */
    /* subnormal in F16: the value in units of 2^-24 is m * 2^(e - 126), e <= 112 */
    uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - e;
    uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1))) q++;
    return sign | (uint16_t)q; /* q may reach 0x400: the least normal, encoded alike */
}

#if defined(__x86_64__)
#include <immintrin.h>

/* The CPU's own conversion: IEEE round to nearest even with subnormals (MXCSR's DAZ/FTZ are
 * never set here), NaN quieted with its leading payload bits, as ckpt_f32_to_f16 does:
 * tests/unit/cast.c compares the two. ~7 ns a value in C, a fraction of that here. */
__attribute__((target("avx,f16c"))) static void f16_by_f16c(const float *in, size_t n,
                                                            uint16_t *out) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, &in[i], 4);
        out[i] = ckpt_f32_to_f16(u);
    }
}
#endif

void ckpt_f32_to_f16_many(const float *in, size_t n, uint16_t *out) {
#if defined(__x86_64__)
    if (ckpt_cpu_f16c()) {
        f16_by_f16c(in, n, out);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &in[i], 4);
        out[i] = ckpt_f32_to_f16(u);
    }
}

static size_t encode_f32(ckpt_dtype to, const float *in, size_t n, unsigned char *out) {
    if (to == CKPT_F16) { /* out is the cast scratch: malloc'd, so aligned for uint16_t */
        ckpt_f32_to_f16_many(in, n, (uint16_t *)(void *)out);
        return n * 2;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &in[i], 4);
        if (to == CKPT_F32) {
            u = ckpt_f32_to_f32(u);
            memcpy(out + 4 * i, &u, 4);
        } else {
            uint16_t v = to == CKPT_F16 ? ckpt_f32_to_f16(u) : ckpt_f32_to_bf16(u);
            memcpy(out + 2 * i, &v, 2);
        }
    }
    return n * (to == CKPT_F32 ? 4 : 2);
}

/* F64 values rounded once, straight to the target (through a float they would be rounded
 * twice, which is not always the nearest). */
static size_t encode_f64(ckpt_dtype to, const unsigned char *src, size_t n, unsigned char *out) {
    for (size_t i = 0; i < n; i++) {
        double x;
        memcpy(&x, src + 8 * i, 8);
        if (to == CKPT_F32) {
            uint32_t v = ckpt_round_float(x, 23, 8);
            memcpy(out + 4 * i, &v, 4);
        } else {
            uint16_t v =
                (uint16_t)(to == CKPT_F16 ? ckpt_round_float(x, 10, 5) : ckpt_round_float(x, 7, 8));
            memcpy(out + 2 * i, &v, 2);
        }
    }
    return n * (to == CKPT_F32 ? 4 : 2);
}

/* The cast tensors as one virtual source, laid end to end: a read converts the source
 * elements under the bytes asked for, so a writer's reads produce them as it goes and each byte
 * is written once, into OUT (an earlier version cast into a temporary file first, which cost
 * OUT's size in disk space and a second pass). */
typedef struct cast_entry {
    uint64_t at;      /* first byte in the virtual source */
    uint64_t bytes;   /* its bytes there: numel * the target's size */
    ckpt_tensor orig; /* the tensor as it was: its dtype and pieces are read */
} cast_entry;
_Static_assert(offsetof(cast_entry, at) == 0, "entries are searched by their first member");

typedef struct cast_source {
    const ckpt_catalog *cat;
    ckpt_dtype to;
    size_t n;
    cast_entry *e;
    /* Reads are serialized: one conversion scratch, and a writer reads in order anyway. */
    pthread_mutex_t lock;
    unsigned char *src, *dst;
    float *f32;
} cast_source;

static _Thread_local char cast_error[sizeof(((ckpt_err *)0)->msg)];

static const char *cast_last_error(void) {
    return cast_error[0] ? cast_error : "error while casting";
}

static void cast_source_free(cast_source *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) planner_piece_index_free(c->e[i].orig.index);
    pthread_mutex_destroy(&c->lock);
    free(c->e);
    free(c->src);
    free(c->dst);
    free(c->f32);
    free(c);
}

/* The entry holding byte off (entries are contiguous from 0; off is inside the source). */
static const cast_entry *entry_at(const cast_source *c, uint64_t off) {
    return &c->e[last_at_or_before_in(c->e, sizeof *c->e, c->n, off)];
}

/* Up to len cast bytes at off: the whole blocks under them are read and converted, and as
 * much of the one entry holding off as fits is copied out (callers loop, as for a file). */
static ssize_t convert_at(cast_source *c, void *buf, size_t len, uint64_t off) {
    const cast_entry *e = entry_at(c, off);
    const ckpt_tensor *t = &e->orig;
    const ckpt_dtype_info *info = ckpt_dtype_info_of(t->dtype);
    uint64_t rel = off - e->at, out_block = (uint64_t)info->block * (c->to == CKPT_F32 ? 4 : 2);
    uint64_t end = e->bytes - rel < len ? e->bytes : rel + len;
    uint64_t first = rel / out_block, last = (end + out_block - 1) / out_block;
    size_t n = last - first < CHUNK_ELEMS / info->block ? (size_t)(last - first)
                                                        : CHUNK_ELEMS / info->block;
    ckpt_err err;
    int rc =
        out_tensor_read(c->cat, t, first * info->block_bytes, c->src, n * info->block_bytes, &err);
    if (rc) {
        snprintf(cast_error, sizeof cast_error, "%s", err.msg);
        return rc;
    }
    size_t made;
    if (t->dtype == CKPT_F64) {
        made = encode_f64(c->to, c->src, n, c->dst);
    } else {
        decode_f32(t->dtype, c->src, n, c->f32);
        made = encode_f32(c->to, c->f32, n * info->block, c->dst);
    }
    size_t skip = (size_t)(rel - first * out_block);
    size_t give = made - skip < end - rel ? made - skip : (size_t)(end - rel);
    memcpy(buf, c->dst + skip, give);
    return (ssize_t)give;
}

static ssize_t cast_pread(void *ctx, void *buf, size_t len, uint64_t off) {
    cast_source *c = ctx;
    uint64_t total = c->n ? c->e[c->n - 1].at + c->e[c->n - 1].bytes : 0;
    if (off >= total || len == 0) return 0;
    pthread_mutex_lock(&c->lock);
    ssize_t r = convert_at(c, buf, len, off);
    pthread_mutex_unlock(&c->lock);
    return r;
}

static void release(void *ctx) {
    cast_source_free(ctx);
}

static const ckpt_virtual_ops cast_ops = {cast_pread, cast_last_error, release};

static bool cast_this(const ckpt_tensor *t, ckpt_dtype to, bool quantized, bool keep_vectors) {
    return !t->aside && !(keep_vectors && t->ndim < 2) &&
           ckpt_cast_applies(t->dtype, to, quantized);
}

static cast_source *cast_source_new(const ckpt_catalog *cat, ckpt_dtype to, size_t n) {
    cast_source *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cat = cat;
    c->to = to;
    pthread_mutex_init(&c->lock, NULL);
    c->e = calloc(n ? n : 1, sizeof *c->e);
    c->src = malloc(CHUNK_ELEMS * 8);
    c->dst = malloc(CHUNK_ELEMS * 4);
    c->f32 = malloc(CHUNK_ELEMS * sizeof(float));
    if (!c->e || !c->src || !c->dst || !c->f32) {
        cast_source_free(c);
        return NULL;
    }
    return c;
}

int ckpt_cast_tensors(ckpt_catalog *cat, ckpt_dtype to, bool quantized, bool keep_vectors,
                      size_t *count, ckpt_err *err) {
    *count = 0;
    if (to != CKPT_F32 && to != CKPT_F16 && to != CKPT_BF16)
        return ckpt_fail(err, -EINVAL, "casting to %s: only F32, F16 and BF16 are targets",
                         ckpt_dtype_info_of(to)->name);
    size_t n = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (!cast_this(t, to, quantized, keep_vectors)) continue;
        if (t->incomplete)
            return ckpt_fail(err, -EIO,
                             "tensor \"%.*s\" is incomplete (part of it is stored nowhere)",
                             SHOWN(t->name_len), t->name);
        n++;
    }
    if (n == 0) return 0;
    cast_source *c = cast_source_new(cat, to, n);
    if (!c) return ckpt_fail(err, -ENOMEM, "out of memory");
    uint64_t at = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (!cast_this(t, to, quantized, keep_vectors)) continue;
        c->e[c->n++] =
            (cast_entry){.at = at, .bytes = t->numel * (to == CKPT_F32 ? 4 : 2), .orig = *t};
        at += c->e[c->n - 1].bytes;
    }
    uint32_t src;
    int rc = catalog_add_virtual_source(cat, "(cast tensors)", at, &cast_ops, c, &src, err);
    if (rc) {
        for (size_t k = 0; k < c->n; k++) c->e[k].orig.index = NULL; /* still the tensors' */
        cast_source_free(c);
        return rc;
    }
    /* From here the source owns c, and each entry's piece index moves into it. */
    for (size_t i = 0; i < cat->ntensors; i++)
        if (cast_this(&cat->tensors[i], to, quantized, keep_vectors)) cat->tensors[i].index = NULL;
    arena *mem = &cat->priv->mem;
    size_t k = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        ckpt_tensor *t = &cat->tensors[i];
        if (!cast_this(t, to, quantized, keep_vectors)) continue;
        ckpt_piece *p = arena_alloc(mem, sizeof *p);
        uint64_t *origin = arena_array(mem, t->ndim ? t->ndim : 1, sizeof *origin);
        uint64_t *sizes = arena_array(mem, t->ndim ? t->ndim : 1, sizeof *sizes);
        if (!p || !origin || !sizes) return ckpt_fail(err, -ENOMEM, "out of memory");
        if (t->ndim) memcpy(sizes, t->shape, t->ndim * sizeof *sizes);
        *p = (ckpt_piece){
            .source = src, .file_offset = c->e[k++].at, .offsets = origin, .sizes = sizes};
        t->pieces = p;
        t->npieces = 1;
        t->dtype = to;
        t->nbytes = t->numel * (to == CKPT_F32 ? 4 : 2);
        ++*count;
    }
    return 0;
}
