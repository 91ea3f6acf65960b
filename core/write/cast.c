/* convert --dtype: float tensors rounded to F32, F16 or BF16 (to nearest, ties to even, as
 * numpy's astype does), or quantized to Q8_0 or Q4_0 block by block (quant_ref.c), read
 * through a virtual source that converts as it is read, so every writer sees plain tensors of
 * the new dtype. */
#include "cast.h"

#include "quant_ref.h"

#include "../model/catalog.h"
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

/* One chunk of whole blocks as floats (every source dtype but F64, whose values a float may not
 * hold). */
static void decode_f32(ckpt_dtype dt, const unsigned char *src, size_t nblocks, float *f32) {
    if (dt == CKPT_F32)
        memcpy(f32, src, nblocks * sizeof *f32);
    else
        ckpt_to_f32(dt, src, nblocks, f32);
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
    uint64_t bytes;   /* its bytes there: numel in the target's dtype */
    ckpt_tensor orig; /* the tensor as it was: its dtype and pieces are read */
    ckpt_dtype to;    /* the target */
} cast_entry;
_Static_assert(offsetof(cast_entry, at) == 0, "entries are searched by their first member");

typedef struct cast_source {
    const ckpt_catalog *cat;
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

/* Bytes of n elements in dtype `to` (n a whole number of its blocks). */
static uint64_t target_bytes(ckpt_dtype to, uint64_t n) {
    const ckpt_dtype_info *info = ckpt_dtype_info_of(to);
    return n / info->block * info->block_bytes;
}

/* Up to len cast bytes at off: the whole blocks under them are read and converted, and as
 * much of the one entry holding off as fits is copied out (callers loop, as for a file). A unit
 * is the fewest elements that are whole blocks of both dtypes (a quantized target's block of 32
 * floats; a dequantized source's block). */
static ssize_t convert_at(cast_source *c, void *buf, size_t len, uint64_t off) {
    const cast_entry *e = entry_at(c, off);
    const ckpt_tensor *t = &e->orig;
    const ckpt_dtype_info *info = ckpt_dtype_info_of(t->dtype);
    uint64_t q = ckpt_dtype_info_of(e->to)->block, unit = info->block > q ? info->block : q;
    uint64_t rel = off - e->at, out_unit = target_bytes(e->to, unit);
    uint64_t end = e->bytes - rel < len ? e->bytes : rel + len;
    uint64_t first = rel / out_unit, last = (end + out_unit - 1) / out_unit;
    size_t n = last - first < CHUNK_ELEMS / unit ? (size_t)(last - first) : CHUNK_ELEMS / unit;
    uint64_t src_blocks = n * unit / info->block;
    ckpt_err err;
    int rc = out_tensor_read(c->cat, t, first * unit / info->block * info->block_bytes, c->src,
                             src_blocks * info->block_bytes, &err);
    if (rc) {
        snprintf(cast_error, sizeof cast_error, "%s", err.msg);
        return rc;
    }
    size_t made;
    if (t->dtype == CKPT_F64 && q == 1) {
        made = encode_f64(e->to, c->src, n * unit, c->dst);
    } else {
        if (t->dtype == CKPT_F64) /* rounded to float first, as gguf-py's quantize_rows */
            for (uint64_t i = 0; i < src_blocks; i++) {
                double x;
                memcpy(&x, c->src + 8 * i, 8);
                c->f32[i] = (float)x;
            }
        else
            decode_f32(t->dtype, c->src, src_blocks, c->f32);
        made = q == 1 ? encode_f32(e->to, c->f32, n * unit, c->dst)
                      : quant_ref_rows(e->to, c->f32, n * unit, c->dst);
    }
    size_t skip = (size_t)(rel - first * out_unit);
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

static cast_source *cast_source_new(const ckpt_catalog *cat, size_t n) {
    cast_source *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cat = cat;
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

/* What a tensor becomes: its dtype when it is left as it is. */
typedef ckpt_dtype (*target_fn)(const ckpt_tensor *t, const void *ctx);

typedef struct float_cast {
    ckpt_dtype to;
    bool quantized, keep_vectors;
} float_cast;

static ckpt_dtype float_target(const ckpt_tensor *t, const void *ctx) {
    const float_cast *fc = ctx;
    return !t->aside && !(fc->keep_vectors && t->ndim < 2) &&
                   ckpt_cast_applies(t->dtype, fc->to, fc->quantized)
               ? fc->to
               : t->dtype;
}

/* Every model tensor whose target is another dtype reads from one virtual source from here. */
static int cast_by(ckpt_catalog *cat, target_fn target, const void *ctx, size_t *count,
                   ckpt_err *err) {
    *count = 0;
    size_t n = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (target(t, ctx) == t->dtype) continue;
        if (t->incomplete)
            return ckpt_fail(err, -EIO,
                             "tensor \"%.*s\" is incomplete (part of it is stored nowhere)",
                             SHOWN(t->name_len), t->name);
        n++;
    }
    if (n == 0) return 0;
    cast_source *c = cast_source_new(cat, n);
    if (!c) return ckpt_fail(err, -ENOMEM, "out of memory");
    uint64_t at = 0;
    ckpt_dtype *target_of = calloc(cat->ntensors ? cat->ntensors : 1, sizeof *target_of);
    if (!target_of) {
        cast_source_free(c);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        ckpt_dtype to = target(t, ctx);
        target_of[i] = to;
        if (to == t->dtype) continue;
        c->e[c->n++] =
            (cast_entry){.at = at, .bytes = target_bytes(to, t->numel), .orig = *t, .to = to};
        at += c->e[c->n - 1].bytes;
    }
    uint32_t src;
    int rc = catalog_add_virtual_source(cat, "(cast tensors)", at, &cast_ops, c, &src, err);
    if (rc) {
        for (size_t k = 0; k < c->n; k++) c->e[k].orig.index = NULL; /* still the tensors' */
        cast_source_free(c);
        free(target_of);
        return rc;
    }
    /* From here the source owns c, and each entry's piece index moves into it. */
    for (size_t i = 0; i < cat->ntensors; i++)
        if (target_of[i] != cat->tensors[i].dtype) cat->tensors[i].index = NULL;
    arena *mem = &cat->priv->mem;
    size_t k = 0;
    for (size_t i = 0; i < cat->ntensors && !rc; i++) {
        ckpt_tensor *t = &cat->tensors[i];
        if (target_of[i] == t->dtype) continue;
        ckpt_piece *p = arena_alloc(mem, sizeof *p);
        uint64_t *origin = arena_array(mem, t->ndim ? t->ndim : 1, sizeof *origin);
        uint64_t *sizes = arena_array(mem, t->ndim ? t->ndim : 1, sizeof *sizes);
        if (!p || !origin || !sizes) {
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
            break;
        }
        if (t->ndim) memcpy(sizes, t->shape, t->ndim * sizeof *sizes);
        *p = (ckpt_piece){
            .source = src, .file_offset = c->e[k++].at, .offsets = origin, .sizes = sizes};
        t->pieces = p;
        t->npieces = 1;
        t->dtype = target_of[i];
        t->nbytes = target_bytes(target_of[i], t->numel);
        ++*count;
    }
    free(target_of);
    return rc;
}

int ckpt_cast_tensors(ckpt_catalog *cat, ckpt_dtype to, bool quantized, bool keep_vectors,
                      size_t *count, ckpt_err *err) {
    *count = 0;
    if (to != CKPT_F32 && to != CKPT_F16 && to != CKPT_BF16)
        return ckpt_fail(err, -EINVAL, "casting to %s: only F32, F16 and BF16 are targets",
                         ckpt_dtype_info_of(to)->name);
    float_cast fc = {to, quantized, keep_vectors};
    return cast_by(cat, float_target, &fc, count, err);
}

/* llama.cpp's choice for a GGUF of this type (convert_hf_to_gguf.py's for --outtype q8_0):
 * vectors (norms, biases) and the position embeddings stay as they are, a matrix whose rows
 * are not whole blocks of 32 becomes F16, every other float matrix is quantized. */
static ckpt_dtype llama_quant_target(const ckpt_tensor *t, const void *ctx) {
    ckpt_dtype to = *(const ckpt_dtype *)ctx;
    static const char pos[] = "position_embd.weight";
    if (t->aside || t->ndim < 2 || !ckpt_cast_applies(t->dtype, to, false) ||
        (t->name_len == sizeof pos - 1 && memcmp(t->name, pos, sizeof pos - 1) == 0))
        return t->dtype;
    if (t->shape[t->ndim - 1] % ckpt_dtype_info_of(to)->block)
        return t->dtype == CKPT_F16 ? t->dtype : CKPT_F16;
    return to;
}

int ckpt_quantize_tensors(ckpt_catalog *cat, ckpt_dtype to, size_t *count, ckpt_err *err) {
    *count = 0;
    if (!quant_ref_supported(to))
        return ckpt_fail(err, -EINVAL, "quantizing to %s: only Q8_0 and Q4_0 are targets",
                         ckpt_dtype_info_of(to)->name);
    return cast_by(cat, llama_quant_target, &to, count, err);
}
