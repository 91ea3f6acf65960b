/* convert --dtype: float tensors rounded to F32, F16 or BF16 (to nearest, ties to even, as
 * numpy's astype does), written once to a temporary file the catalog then reads them from, so
 * every writer sees plain tensors of the new dtype. */
#include "cast.h"

#include "catalog.h"
#include "dequant.h"
#include "pwrite_pieces.h"
#include "writers/writers.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CHUNK_ELEMS = 1 << 20 };

/* The cast file starts with this, so it is never mistaken for a zstd file when opened. */
static const char cast_magic[8] = "CKPTCAST";

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

static size_t encode_f32(ckpt_dtype to, const float *in, size_t n, unsigned char *out) {
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

static int write_all(int fd, const void *p, size_t n, uint64_t at, const char *dir, ckpt_err *err) {
    int e = pwrite_pieces(fd, p, n, at);
    return e ? ckpt_fail(err, -e, "%s: writing cast tensors to a temporary file: %s", dir,
                         strerror(e))
             : 0;
}

typedef struct cast_buffers {
    unsigned char *src, *dst;
    float *f32;
} cast_buffers;

/* Writes tensor t cast to `to` at *at of fd, advancing *at. */
static int cast_one(const ckpt_catalog *cat, const ckpt_tensor *t, ckpt_dtype to, int fd,
                    uint64_t *at, cast_buffers *b, const char *dir, ckpt_err *err) {
    const ckpt_dtype_info *info = ckpt_dtype_info_of(t->dtype);
    uint64_t nblocks = t->numel / info->block;
    size_t per_chunk = CHUNK_ELEMS / info->block;
    for (uint64_t k = 0; k < nblocks;) {
        size_t n = nblocks - k < per_chunk ? (size_t)(nblocks - k) : per_chunk;
        int rc = tensor_read(cat, t, k * info->block_bytes, b->src, n * info->block_bytes, err);
        if (rc) return rc;
        size_t len;
        if (t->dtype == CKPT_F64) {
            len = encode_f64(to, b->src, n, b->dst);
        } else {
            decode_f32(t->dtype, b->src, n, b->f32);
            len = encode_f32(to, b->f32, n * info->block, b->dst);
        }
        if ((rc = write_all(fd, b->dst, len, *at, dir, err))) return rc;
        *at += len;
        k += n;
    }
    return 0;
}

/* The cast file: unlinked from the start where the file system allows (O_TMPFILE), so a kill
 * leaves nothing behind; else a named temporary removed at once. */
static int open_spool(const char *dir, char *path, size_t cap, ckpt_err *err) {
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(path, cap, "%s/.ckptfs-cast-XXXXXX", dir);
        fd = mkostemp(path, O_CLOEXEC);
        if (fd < 0)
            return ckpt_fail(err, -errno, "%s: cannot create a temporary file for cast tensors: %s",
                             dir, strerror(errno));
        unlink(path);
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

static bool cast_this(const ckpt_tensor *t, ckpt_dtype to, bool quantized, bool keep_vectors) {
    return !t->aside && !(keep_vectors && t->ndim < 2) &&
           ckpt_cast_applies(t->dtype, to, quantized);
}

int ckpt_cast_tensors(ckpt_catalog *cat, ckpt_dtype to, bool quantized, bool keep_vectors,
                      const char *spool_dir, size_t *count, ckpt_err *err) {
    *count = 0;
    if (to != CKPT_F32 && to != CKPT_F16 && to != CKPT_BF16)
        return ckpt_fail(err, -EINVAL, "casting to %s: only F32, F16 and BF16 are targets",
                         ckpt_dtype_info_of(to)->name);
    uint64_t *offset = calloc(cat->ntensors ? cat->ntensors : 1, sizeof *offset);
    cast_buffers b = {malloc(CHUNK_ELEMS * 8), malloc(CHUNK_ELEMS * 4),
                      malloc(CHUNK_ELEMS * sizeof(float))};
    char path[64 + 4096];
    int fd = -1, rc = 0;
    if (!offset || !b.src || !b.dst || !b.f32)
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
    else if ((fd = open_spool(spool_dir, path, sizeof path, err)) < 0)
        rc = fd;
    uint64_t at = sizeof cast_magic;
    if (!rc) rc = write_all(fd, cast_magic, sizeof cast_magic, 0, spool_dir, err);
    for (size_t i = 0; !rc && i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (!cast_this(t, to, quantized, keep_vectors)) continue;
        if (t->incomplete)
            rc =
                ckpt_fail(err, -EIO, "tensor \"%.*s\" is incomplete (part of it is stored nowhere)",
                          SHOWN(t->name_len), t->name);
        else {
            offset[i] = at;
            rc = cast_one(cat, t, to, fd, &at, &b, spool_dir, err);
            ++*count;
        }
    }
    uint32_t src = 0;
    /* Opened again by its /proc name: the catalog keeps a descriptor of its own. */
    if (!rc && *count) rc = catalog_add_source(cat, path, "(cast tensors)", &src, err);
    arena *mem = &cat->priv->mem;
    for (size_t i = 0; !rc && *count && i < cat->ntensors; i++) {
        ckpt_tensor *t = &cat->tensors[i];
        if (!cast_this(t, to, quantized, keep_vectors)) continue;
        ckpt_piece *p = arena_alloc(mem, sizeof *p);
        uint64_t *origin = arena_array(mem, t->ndim ? t->ndim : 1, sizeof *origin);
        uint64_t *sizes = arena_array(mem, t->ndim ? t->ndim : 1, sizeof *sizes);
        if (!p || !origin || !sizes) {
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
            break;
        }
        if (t->ndim) memcpy(sizes, t->shape, t->ndim * sizeof *sizes);
        *p = (ckpt_piece){
            .source = src, .file_offset = offset[i], .offsets = origin, .sizes = sizes};
        piece_index_free(t->index);
        t->index = NULL;
        t->pieces = p;
        t->npieces = 1;
        t->dtype = to;
        t->nbytes = t->numel * (to == CKPT_F32 ? 4 : 2);
    }
    if (fd >= 0) close(fd);
    free(offset);
    free(b.src);
    free(b.dst);
    free(b.f32);
    return rc;
}
