/* Statistics and differences of tensor values, streamed through the planner on all cores.
 *
 * Work is cut into units of UNIT_ELEMS elements of one tensor (or one pair of tensors), taken
 * by worker threads in any order; each unit's result is kept and the results of a tensor are
 * merged in unit order at the end, so the figures do not depend on the number of threads and
 * memory grows only with the number of units (one small record per 512 Ki elements).
 *
 * Numerics: values are converted to double (exact for every supported dtype but 64-bit
 * integers above 2^53). Inside a unit, blocks of BLOCK values are summed pairwise (numpy's
 * scheme: halves recursively, eight running sums below 128 values) and block results are
 * merged by a binary cascade, and units likewise: the sum of n values is pairwise throughout,
 * with an error bound growing with log2(n), not n. The variance uses a two-pass sum of squared
 * deviations per block and Chan, Golub and LeVeque's update to merge blocks, which stays right
 * when the mean is large against the spread (the one-pass sumsq - sum^2/n does not). */
#include "stats.h"
#include "../util/search.h"

/* The value loops are simple enough for the vectorizer, which GCC runs fully only at -O3. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__)
#pragma GCC optimize("O3")
#endif

#include "../read/dequant.h"
#include "../read/segread.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    UNIT_ELEMS = 1 << 19, /* a multiple of every ggml block (32, 256) */
    BLOCK = 4096,         /* values converted and summed together: stays in the L1/L2 cache */
    SEGS = 256,
    CASCADE = 64,
    MAX_THREADS = 256,
};

/* ---- derived figures ---- */

double ckpt_stats_mean(const ckpt_stats *s) {
    return s->finite ? s->sum / (double)s->finite : NAN;
}

double ckpt_stats_std(const ckpt_stats *s) {
    return s->finite ? sqrt(s->m2 / (double)s->finite) : NAN;
}

double ckpt_stats_l2(const ckpt_stats *s) {
    return sqrt(s->sumsq);
}

double ckpt_diff_rms(const ckpt_diff *d) {
    uint64_t n = d->count - d->nonfinite;
    return n ? sqrt(d->sumsq_diff / (double)n) : 0.0;
}

double ckpt_diff_cosine(const ckpt_diff *d) {
    if (d->sumsq_a == 0 || d->sumsq_b == 0) return NAN;
    double c = d->dot / (sqrt(d->sumsq_a) * sqrt(d->sumsq_b));
    return c > 1 ? 1 : c < -1 ? -1 : c;
}

double ckpt_diff_relative(const ckpt_diff *d) {
    return d->sumsq_b > 0 ? sqrt(d->sumsq_diff) / sqrt(d->sumsq_b) : NAN;
}

/* ---- values as doubles ---- */

bool ckpt_stats_supported(ckpt_dtype dt) {
    switch (dt) {
    case CKPT_BOOL:
    case CKPT_U8:
    case CKPT_I8:
    case CKPT_U16:
    case CKPT_I16:
    case CKPT_U32:
    case CKPT_I32:
    case CKPT_U64:
    case CKPT_I64:
    case CKPT_F32:
    case CKPT_F64:
    case CKPT_F8_E4M3FNUZ:
    case CKPT_F8_E5M2FNUZ:
    case CKPT_F8_E8M0:
        return true;
    default:
        return ckpt_to_f32_supported(dt);
    }
}

#define CONVERT(T)                                                                                 \
    for (size_t i = 0; i < n; i++) {                                                               \
        T v;                                                                                       \
        memcpy(&v, src + i * sizeof v, sizeof v);                                                  \
        dst[i] = (double)v;                                                                        \
    }

/* The AMD "fnuz" float8 formats: no infinities, no negative zero, 0x80 is the only NaN; the
 * bias is one more than in the OCP formats (8 for e4m3, 16 for e5m2). */
static double fnuz_to_double(uint8_t b, int man_bits, int bias) {
    if (b == 0x80) return NAN;
    int exp = (b & 0x7f) >> man_bits, man = b & ((1 << man_bits) - 1);
    double v = exp ? ldexp(1.0 + man / (double)(1 << man_bits), exp - bias)
                   : ldexp(man / (double)(1 << man_bits), 1 - bias);
    return (b & 0x80) ? -v : v;
}

/* n values (a multiple of the dtype's block) at src into dst; tmp holds BLOCK floats. */
static void to_double(ckpt_dtype dt, const unsigned char *src, size_t n, double *dst, float *tmp) {
    switch (dt) {
    case CKPT_BOOL:
        for (size_t i = 0; i < n; i++) dst[i] = src[i] != 0;
        break;
    case CKPT_U8:
        CONVERT(uint8_t);
        break;
    case CKPT_I8:
        CONVERT(int8_t);
        break;
    case CKPT_U16:
        CONVERT(uint16_t);
        break;
    case CKPT_I16:
        CONVERT(int16_t);
        break;
    case CKPT_U32:
        CONVERT(uint32_t);
        break;
    case CKPT_I32:
        CONVERT(int32_t);
        break;
    case CKPT_U64:
        CONVERT(uint64_t);
        break;
    case CKPT_I64:
        CONVERT(int64_t);
        break;
    case CKPT_F32:
        CONVERT(float);
        break;
    case CKPT_F64:
        CONVERT(double);
        break;
    case CKPT_F8_E4M3FNUZ:
        for (size_t i = 0; i < n; i++) dst[i] = fnuz_to_double(src[i], 3, 8);
        break;
    case CKPT_F8_E5M2FNUZ:
        for (size_t i = 0; i < n; i++) dst[i] = fnuz_to_double(src[i], 2, 16);
        break;
    case CKPT_F8_E8M0: /* an exponent only (MX scales): 2^(e-127), 0xFF is NaN */
        for (size_t i = 0; i < n; i++) dst[i] = src[i] == 0xff ? NAN : ldexp(1.0, src[i] - 127);
        break;
    case CKPT_BF16: /* the hot case of large checkpoints: inline, no call per element */
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)(src[2 * i] | src[2 * i + 1] << 8) << 16;
            float f;
            memcpy(&f, &u, 4);
            dst[i] = f;
        }
        break;
    default: {
        unsigned block = ckpt_dtype_info_of(dt)->block;
        ckpt_to_f32(dt, src, n / block, tmp);
        for (size_t i = 0; i < n; i++) dst[i] = tmp[i];
        break;
    }
    }
}

/* ---- pairwise sums ---- */

static double pairwise_dot(const double *x, const double *y, size_t n) {
    if (n <= 128) {
        double r[8] = {0};
        size_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++) r[k] += x[i + k] * y[i + k];
        double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) s += x[i] * y[i];
        return s;
    }
    size_t half = (n / 2 + 7) & ~(size_t)7;
    return pairwise_dot(x, y, half) + pairwise_dot(x + half, y + half, n - half);
}

static bool finite_bits(double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    return (u & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}

/* ---- merging partial results ---- */

static void stats_merge(void *into, const void *from) {
    ckpt_stats *a = into;
    const ckpt_stats *b = from;
    if (b->finite && !a->finite) {
        a->min = b->min;
        a->max = b->max;
        a->absmax = b->absmax;
        a->sum = b->sum;
        a->sumsq = b->sumsq;
        a->m2 = b->m2;
    } else if (b->finite) {
        double na = (double)a->finite, nb = (double)b->finite;
        double delta = b->sum / nb - a->sum / na;
        a->m2 += b->m2 + delta * delta * (na * nb / (na + nb));
        a->sum += b->sum;
        a->sumsq += b->sumsq;
        if (b->min < a->min) a->min = b->min;
        if (b->max > a->max) a->max = b->max;
        if (b->absmax > a->absmax) a->absmax = b->absmax;
    }
    a->count += b->count;
    a->finite += b->finite;
    a->nan += b->nan;
    a->posinf += b->posinf;
    a->neginf += b->neginf;
    a->zeros += b->zeros;
}

static void diff_merge(void *into, const void *from) {
    ckpt_diff *a = into;
    const ckpt_diff *b = from;
    a->count += b->count;
    a->bytes_identical = a->bytes_identical && b->bytes_identical;
    a->bytes_only = a->bytes_only || b->bytes_only;
    a->beyond += b->beyond;
    a->nonfinite += b->nonfinite;
    a->nonfinite_mismatch += b->nonfinite_mismatch;
    if (b->max_abs > a->max_abs) a->max_abs = b->max_abs;
    if (b->max_rel > a->max_rel) a->max_rel = b->max_rel;
    a->sumsq_diff += b->sumsq_diff;
    a->dot += b->dot;
    a->sumsq_a += b->sumsq_a;
    a->sumsq_b += b->sumsq_b;
}

/* A binary counter of partial results: two of the same weight merge into one of double
 * weight, so n partials merge as a balanced tree in order, holding at most log2(n) at a time. */
typedef struct cascade {
    void (*merge)(void *, const void *);
    size_t size, depth;
    unsigned level[CASCADE];
    unsigned char slot[CASCADE][sizeof(ckpt_stats) > sizeof(ckpt_diff) ? sizeof(ckpt_stats)
                                                                       : sizeof(ckpt_diff)];
} cascade;

static void cascade_init(cascade *c, void (*merge)(void *, const void *), size_t size) {
    c->merge = merge;
    c->size = size;
    c->depth = 0;
}

static void cascade_push(cascade *c, const void *item) {
    memcpy(c->slot[c->depth], item, c->size);
    c->level[c->depth++] = 0;
    while (c->depth >= 2 && c->level[c->depth - 1] == c->level[c->depth - 2]) {
        c->merge(c->slot[c->depth - 2], c->slot[c->depth - 1]);
        c->level[c->depth - 2]++;
        c->depth--;
    }
}

/* Merges what is left, smaller (later) partials first; false when nothing was pushed. */
static bool cascade_finish(cascade *c, void *out) {
    if (!c->depth) return false;
    while (c->depth >= 2) {
        c->merge(c->slot[c->depth - 2], c->slot[c->depth - 1]);
        c->depth--;
    }
    memcpy(out, c->slot[0], c->size);
    c->depth = 0;
    return true;
}

/* ---- one block of values ---- */

/* Pairwise sums of x and x^2 in one pass. */
static void pairwise_sum2(const double *x, size_t n, double *sum, double *sumsq) {
    if (n <= 128) {
        double r[8] = {0}, q[8] = {0};
        size_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++) {
                r[k] += x[i + k];
                q[k] += x[i + k] * x[i + k];
            }
        double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        double t = ((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7]));
        for (; i < n; i++) s += x[i], t += x[i] * x[i];
        *sum = s;
        *sumsq = t;
        return;
    }
    size_t half = (n / 2 + 7) & ~(size_t)7;
    double s1, t1, s2, t2;
    pairwise_sum2(x, half, &s1, &t1);
    pairwise_sum2(x + half, n - half, &s2, &t2);
    *sum = s1 + s2;
    *sumsq = t1 + t2;
}

/* Pairwise sum of (x - mean)^2. */
static double pairwise_dev2(const double *x, size_t n, double mean) {
    if (n <= 128) {
        double r[8] = {0};
        size_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++) r[k] += (x[i + k] - mean) * (x[i + k] - mean);
        double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) s += (x[i] - mean) * (x[i] - mean);
        return s;
    }
    size_t half = (n / 2 + 7) & ~(size_t)7;
    return pairwise_dev2(x, half, mean) + pairwise_dev2(x + half, n - half, mean);
}

/* x is overwritten: when some values are not finite, the finite ones move to its front. The
 * common case (all finite) runs branch-free loops the compiler can vectorize. */
static void block_stats(double *x, size_t n, ckpt_stats *s) {
    *s = (ckpt_stats){.count = n};
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !finite_bits(x[i]);
    size_t k = n;
    if (bad) {
        k = 0;
        for (size_t i = 0; i < n; i++) {
            double v = x[i];
            if (finite_bits(v))
                x[k++] = v;
            else if (isnan(v))
                s->nan++;
            else if (v > 0)
                s->posinf++;
            else
                s->neginf++;
        }
    }
    s->finite = k;
    if (!k) return;
    double lo = x[0], hi = x[0];
    uint64_t zeros = 0;
    for (size_t i = 0; i < k; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        zeros += x[i] == 0;
    }
    s->zeros = zeros;
    s->min = lo;
    s->max = hi;
    s->absmax = fabs(lo) > fabs(hi) ? fabs(lo) : fabs(hi);
    pairwise_sum2(x, k, &s->sum, &s->sumsq);
    s->m2 = pairwise_dev2(x, k, s->sum / (double)k);
}

/* a and b are overwritten: finite pairs move to the front, a - b goes to d. */
static void block_diff(double *a, double *b, size_t n, double *d, double atol, double rtol,
                       ckpt_diff *r) {
    *r = (ckpt_diff){.count = n, .bytes_identical = true};
    size_t k = 0;
    double max_abs = 0, max_rel = 0;
    for (size_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        if (!finite_bits(x) || !finite_bits(y)) {
            r->nonfinite++;
            if (!((isnan(x) && isnan(y)) || x == y)) {
                r->nonfinite_mismatch++;
                r->beyond++;
            }
            continue;
        }
        double diff = x - y, ad = fabs(diff), ay = fabs(y);
        max_abs = ad > max_abs ? ad : max_abs;
        if (y != 0 && ad / ay > max_rel) max_rel = ad / ay;
        r->beyond += ad > atol + rtol * ay;
        a[k] = x;
        b[k] = y;
        d[k++] = diff;
    }
    r->max_abs = max_abs;
    r->max_rel = max_rel;
    r->sumsq_diff = pairwise_dot(d, d, k);
    r->dot = pairwise_dot(a, b, k);
    r->sumsq_a = pairwise_dot(a, a, k);
    r->sumsq_b = pairwise_dot(b, b, k);
}

/* ---- reading a unit ---- */

typedef struct worker_buf {
    unsigned char *raw[2];
    char *scratch;
    double *x[2], *dev;
    float *tmp;
} worker_buf;

/* Bytes of elements [first, first+n) of t into dst. */
static int read_elems(const ckpt_catalog *cat, const ckpt_tensor *t, uint64_t first, uint64_t n,
                      unsigned char *dst, char *scratch, ckpt_err *err) {
    const ckpt_dtype_info *info = ckpt_dtype_info_of(t->dtype);
    uint64_t off = first / info->block * info->block_bytes;
    uint64_t len = n / info->block * info->block_bytes, pos = 0;
    ckpt_segment seg[SEGS];
    while (pos < len) {
        uint64_t done;
        size_t nseg = ckpt_plan(t, off + pos, len - pos, seg, SEGS, &done);
        int e = -EIO;
        if (nseg && done) e = ckpt_read_segments(cat, seg, nseg, (char *)dst + pos, scratch);
        if (e)
            return ckpt_fail(err, e, "tensor %.*s: reading bytes %llu..%llu: %s",
                             (int)(t->name_len > 120 ? 120 : t->name_len), t->name,
                             (unsigned long long)(off + pos), (unsigned long long)(off + len - 1),
                             strerror(-e));
        pos += done;
    }
    return 0;
}

static uint64_t units_of(const ckpt_tensor *t) {
    return (t->numel + UNIT_ELEMS - 1) / UNIT_ELEMS;
}

static uint64_t unit_len(const ckpt_tensor *t, uint64_t u) {
    uint64_t first = u * UNIT_ELEMS;
    return t->numel - first < UNIT_ELEMS ? t->numel - first : UNIT_ELEMS;
}

/* ---- the thread pool over units ---- */

typedef struct job {
    const ckpt_catalog *cat[2];
    const ckpt_tensor *const *t[2];
    size_t n;
    bool diff;
    double atol, rtol;
    bool *bytes_only;     /* diff: per pair */
    uint64_t *first_unit; /* per tensor; [n] = total */
    void *partial;        /* per unit: ckpt_stats or ckpt_diff */
    int *status;
    ckpt_err *msgs;
    atomic_uint_fast64_t next;
    pthread_mutex_t lock;
    ckpt_stats_progress progress;
    void *ctx;
} job;

static size_t tensor_of_unit(const job *j, uint64_t g) {
    return last_at_or_before(j->first_unit, j->n, g);
}

static void fail_tensor(job *j, size_t i, int rc, const ckpt_err *e) {
    pthread_mutex_lock(&j->lock);
    if (!j->status[i]) {
        j->status[i] = rc;
        if (j->msgs) j->msgs[i] = *e;
    }
    pthread_mutex_unlock(&j->lock);
}

static int run_stats_unit(job *j, size_t i, uint64_t u, worker_buf *w, ckpt_stats *out,
                          ckpt_err *err) {
    const ckpt_tensor *t = j->t[0][i];
    uint64_t first = u * UNIT_ELEMS, n = unit_len(t, u);
    int rc = read_elems(j->cat[0], t, first, n, w->raw[0], w->scratch, err);
    if (rc) return rc;
    const ckpt_dtype_info *info = ckpt_dtype_info_of(t->dtype);
    cascade c;
    cascade_init(&c, stats_merge, sizeof(ckpt_stats));
    for (uint64_t at = 0; at < n; at += BLOCK) {
        size_t m = (size_t)(n - at < BLOCK ? n - at : BLOCK);
        to_double(t->dtype, w->raw[0] + at / info->block * info->block_bytes, m, w->x[0], w->tmp);
        ckpt_stats b;
        block_stats(w->x[0], m, &b);
        cascade_push(&c, &b);
    }
    cascade_finish(&c, out);
    return 0;
}

static int run_diff_unit(job *j, size_t i, uint64_t u, worker_buf *w, ckpt_diff *out,
                         ckpt_err *err) {
    const ckpt_tensor *ta = j->t[0][i], *tb = j->t[1][i];
    uint64_t first = u * UNIT_ELEMS, n = unit_len(ta, u);
    int rc = read_elems(j->cat[0], ta, first, n, w->raw[0], w->scratch, err);
    if (!rc) rc = read_elems(j->cat[1], tb, first, n, w->raw[1], w->scratch, err);
    if (rc) return rc;
    const ckpt_dtype_info *ia = ckpt_dtype_info_of(ta->dtype), *ib = ckpt_dtype_info_of(tb->dtype);
    if (j->bytes_only[i]) {
        uint64_t len = n / ia->block * ia->block_bytes, differ = 0;
        for (uint64_t k = 0; k < len; k++) differ += w->raw[0][k] != w->raw[1][k];
        *out = (ckpt_diff){
            .count = n, .bytes_only = true, .bytes_identical = !differ, .beyond = differ};
        return 0;
    }
    bool same = ta->dtype == tb->dtype &&
                memcmp(w->raw[0], w->raw[1], n / ia->block * ia->block_bytes) == 0;
    cascade c;
    cascade_init(&c, diff_merge, sizeof(ckpt_diff));
    for (uint64_t at = 0; at < n; at += BLOCK) {
        size_t m = (size_t)(n - at < BLOCK ? n - at : BLOCK);
        to_double(ta->dtype, w->raw[0] + at / ia->block * ia->block_bytes, m, w->x[0], w->tmp);
        to_double(tb->dtype, w->raw[1] + at / ib->block * ib->block_bytes, m, w->x[1], w->tmp);
        ckpt_diff b;
        block_diff(w->x[0], w->x[1], m, w->dev, j->atol, j->rtol, &b);
        cascade_push(&c, &b);
    }
    cascade_finish(&c, out);
    out->bytes_identical = same;
    return 0;
}

static void *worker(void *arg) {
    job *j = arg;
    worker_buf w = {0};
    size_t raw = UNIT_ELEMS * sizeof(double);
    w.raw[0] = malloc(raw);
    w.raw[1] = j->diff ? malloc(raw) : NULL;
    w.scratch = malloc(SEGREAD_SCRATCH);
    w.x[0] = malloc(BLOCK * sizeof(double));
    w.x[1] = malloc(BLOCK * sizeof(double));
    w.dev = malloc(BLOCK * sizeof(double));
    w.tmp = malloc(BLOCK * sizeof(float));
    bool ok = w.raw[0] && (w.raw[1] || !j->diff) && w.scratch && w.x[0] && w.x[1] && w.dev && w.tmp;
    uint64_t total = j->first_unit[j->n];
    for (;;) {
        uint64_t g = atomic_fetch_add(&j->next, 1);
        if (g >= total) break;
        size_t i = tensor_of_unit(j, g);
        uint64_t u = g - j->first_unit[i];
        ckpt_err err = {{0}};
        int rc;
        if (!ok) {
            rc = ckpt_fail(&err, -ENOMEM, "out of memory for the read buffers");
        } else if (j->diff) {
            rc = run_diff_unit(j, i, u, &w, (ckpt_diff *)j->partial + g, &err);
        } else {
            rc = run_stats_unit(j, i, u, &w, (ckpt_stats *)j->partial + g, &err);
        }
        if (rc) fail_tensor(j, i, rc, &err);
        if (j->progress) {
            const ckpt_tensor *t = j->t[0][i];
            const ckpt_dtype_info *info = ckpt_dtype_info_of(t->dtype);
            uint64_t bytes = unit_len(t, u) / info->block * info->block_bytes;
            if (j->diff) {
                const ckpt_dtype_info *ib = ckpt_dtype_info_of(j->t[1][i]->dtype);
                bytes += unit_len(t, u) / ib->block * ib->block_bytes;
            }
            pthread_mutex_lock(&j->lock);
            j->progress(j->ctx, bytes);
            pthread_mutex_unlock(&j->lock);
        }
    }
    free(w.raw[0]);
    free(w.raw[1]);
    free(w.scratch);
    free(w.x[0]);
    free(w.x[1]);
    free(w.dev);
    free(w.tmp);
    return NULL;
}

static unsigned thread_count(unsigned asked, uint64_t units) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned n = asked ? asked : cpus > 0 ? (unsigned)cpus : 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    if (units < n) n = units ? (unsigned)units : 1;
    return n;
}

/* Runs the units of all tensors whose status is still 0 and merges each tensor's results. */
static int run_job(job *j, unsigned threads, void *out, size_t item) {
    j->first_unit = malloc((j->n + 1) * sizeof *j->first_unit);
    if (!j->first_unit) return -ENOMEM;
    uint64_t total = 0;
    for (size_t i = 0; i < j->n; i++) {
        j->first_unit[i] = total;
        if (!j->status[i]) total += units_of(j->t[0][i]);
    }
    j->first_unit[j->n] = total;
    j->partial = calloc(total ? total : 1, item);
    if (!j->partial) {
        free(j->first_unit);
        return -ENOMEM;
    }
    atomic_init(&j->next, 0);
    pthread_mutex_init(&j->lock, NULL);
    unsigned nt = thread_count(threads, total);
    pthread_t tid[MAX_THREADS];
    unsigned started = 0;
    for (; started + 1 < nt; started++)
        if (pthread_create(&tid[started], NULL, worker, j) != 0) break;
    worker(j); /* the caller works too; with no extra thread it does everything */
    for (unsigned k = 0; k < started; k++) pthread_join(tid[k], NULL);
    pthread_mutex_destroy(&j->lock);

    cascade c;
    cascade_init(&c, j->diff ? diff_merge : stats_merge, item);
    for (size_t i = 0; i < j->n; i++) {
        if (j->status[i]) continue;
        for (uint64_t g = j->first_unit[i]; g < j->first_unit[i + 1]; g++)
            cascade_push(&c, (char *)j->partial + g * item);
        cascade_finish(&c, (char *)out + i * item);
    }
    free(j->partial);
    free(j->first_unit);
    return 0;
}

static int refuse(const ckpt_tensor *t, int *status, ckpt_err *msg) {
    ckpt_err dummy;
    ckpt_err *e = msg ? msg : &dummy;
    int shown = (int)(t->name_len > 120 ? 120 : t->name_len);
    if (!ckpt_stats_supported(t->dtype))
        *status = ckpt_fail(e, -ENOTSUP, "tensor %.*s: values of dtype %s are not supported", shown,
                            t->name, ckpt_dtype_info_of(t->dtype)->name);
    else if (t->incomplete)
        *status = ckpt_fail(e, -EIO, "tensor %.*s: some bytes are in no file (incomplete)", shown,
                            t->name);
    return *status;
}

int ckpt_stats_run(const ckpt_catalog *cat, const ckpt_tensor *const *t, size_t n, unsigned threads,
                   ckpt_stats *out, int *status, ckpt_err *msgs, ckpt_stats_progress progress,
                   void *ctx) {
    for (size_t i = 0; i < n; i++) {
        out[i] = (ckpt_stats){.count = t[i]->numel};
        status[i] = 0;
        refuse(t[i], &status[i], msgs ? &msgs[i] : NULL);
    }
    job j = {.cat = {cat, cat},
             .t = {t, t},
             .n = n,
             .status = status,
             .msgs = msgs,
             .progress = progress,
             .ctx = ctx};
    return run_job(&j, threads, out, sizeof *out);
}

/* The fast path: both tensors name the same bytes of the same files. */
static bool same_bytes(const ckpt_catalog *ca, const ckpt_tensor *a, const ckpt_catalog *cb,
                       const ckpt_tensor *b) {
    if (a->dtype != b->dtype || a->nbytes != b->nbytes || a->incomplete || b->incomplete)
        return false;
    ckpt_segment sa[SEGS], sb[SEGS];
    for (uint64_t pos = 0; pos < a->nbytes;) {
        uint64_t da, db;
        size_t na = ckpt_plan(a, pos, a->nbytes - pos, sa, SEGS, &da);
        size_t nb = ckpt_plan(b, pos, b->nbytes - pos, sb, SEGS, &db);
        if (!na || na != nb || da != db || !da) return false;
        for (size_t k = 0; k < na; k++) {
            if (sa[k].kind != CKPT_SEG_FILE || sb[k].kind != CKPT_SEG_FILE ||
                sa[k].offset != sb[k].offset || sa[k].length != sb[k].length)
                return false;
            const ckpt_source *x = &ca->sources[sa[k].source], *y = &cb->sources[sb[k].source];
            if (x->dev != y->dev || x->ino != y->ino || x->size != y->size ||
                x->mtime.tv_sec != y->mtime.tv_sec || x->mtime.tv_nsec != y->mtime.tv_nsec ||
                x->ctime.tv_sec != y->ctime.tv_sec || x->ctime.tv_nsec != y->ctime.tv_nsec)
                return false;
        }
        pos += da;
    }
    return true;
}

int ckpt_diff_run(const ckpt_catalog *ca, const ckpt_tensor *const *a, const ckpt_catalog *cb,
                  const ckpt_tensor *const *b, size_t n, double atol, double rtol, unsigned threads,
                  ckpt_diff *out, int *status, ckpt_err *msgs, ckpt_stats_progress progress,
                  void *ctx) {
    bool *bytes_only = calloc(n ? n : 1, sizeof *bytes_only);
    if (!bytes_only) return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        out[i] = (ckpt_diff){.count = a[i]->numel, .bytes_identical = true};
        status[i] = 0;
        ckpt_err dummy, *e = msgs ? &msgs[i] : &dummy;
        if (a[i]->numel != b[i]->numel) {
            status[i] =
                ckpt_fail(e, -EINVAL, "tensors of %llu and %llu elements cannot be compared",
                          (unsigned long long)a[i]->numel, (unsigned long long)b[i]->numel);
        } else if (same_bytes(ca, a[i], cb, b[i])) {
            out[i].not_read = true;
            status[i] = 1; /* done: run_job skips it */
        } else if (a[i]->dtype == b[i]->dtype && !ckpt_stats_supported(a[i]->dtype) &&
                   !a[i]->incomplete && !b[i]->incomplete) {
            bytes_only[i] = out[i].bytes_only = true;
        } else if (!refuse(a[i], &status[i], e)) {
            refuse(b[i], &status[i], e);
        }
    }
    job j = {.cat = {ca, cb},
             .t = {a, b},
             .n = n,
             .diff = true,
             .atol = atol,
             .rtol = rtol,
             .bytes_only = bytes_only,
             .status = status,
             .msgs = msgs,
             .progress = progress,
             .ctx = ctx};
    int rc = run_job(&j, threads, out, sizeof *out);
    free(bytes_only);
    for (size_t i = 0; i < n; i++)
        if (status[i] == 1) status[i] = 0;
    return rc;
}

int ckpt_stats_histogram(const ckpt_catalog *cat, const ckpt_tensor *t, double lo, double hi,
                         size_t nbins, uint64_t *bins, ckpt_err *err) {
    memset(bins, 0, nbins * sizeof *bins);
    int status = 0;
    if (refuse(t, &status, err)) return status;
    unsigned char *raw = malloc(UNIT_ELEMS * sizeof(double));
    char *scratch = malloc(SEGREAD_SCRATCH);
    double *x = malloc(BLOCK * sizeof(double));
    float *tmp = malloc(BLOCK * sizeof(float));
    int rc = raw && scratch && x && tmp ? 0 : ckpt_fail(err, -ENOMEM, "out of memory");
    const ckpt_dtype_info *info = ckpt_dtype_info_of(t->dtype);
    double width = hi > lo ? (hi - lo) / (double)nbins : 1;
    for (uint64_t u = 0; !rc && u < units_of(t); u++) {
        uint64_t n = unit_len(t, u);
        rc = read_elems(cat, t, u * UNIT_ELEMS, n, raw, scratch, err);
        for (uint64_t at = 0; !rc && at < n; at += BLOCK) {
            size_t m = (size_t)(n - at < BLOCK ? n - at : BLOCK);
            to_double(t->dtype, raw + at / info->block * info->block_bytes, m, x, tmp);
            for (size_t i = 0; i < m; i++) {
                if (!finite_bits(x[i]) || x[i] < lo || x[i] > hi) continue;
                double k = (x[i] - lo) / width;
                size_t b = k >= (double)nbins ? nbins - 1 : (size_t)k;
                bins[b]++;
            }
        }
    }
    free(raw);
    free(scratch);
    free(x);
    free(tmp);
    return rc;
}

/* ---- JSON ---- */

static size_t put_num(char *p, size_t cap, const char *key, double v, bool defined) {
    if (!defined || !isfinite(v)) return (size_t)snprintf(p, cap, ", \"%s\": null", key);
    return (size_t)snprintf(p, cap, ", \"%s\": %.17g", key, v);
}

size_t ckpt_stats_json_members(const ckpt_stats *s, char *buf) {
    size_t n = (size_t)snprintf(
        buf, CKPT_STATS_JSON_MAX,
        "\"count\": %llu, \"finite\": %llu, \"nan\": %llu, \"posinf\": %llu, \"neginf\": %llu, "
        "\"zeros\": %llu",
        (unsigned long long)s->count, (unsigned long long)s->finite, (unsigned long long)s->nan,
        (unsigned long long)s->posinf, (unsigned long long)s->neginf, (unsigned long long)s->zeros);
    bool any = s->finite > 0;
    n += put_num(buf + n, CKPT_STATS_JSON_MAX - n, "min", s->min, any);
    n += put_num(buf + n, CKPT_STATS_JSON_MAX - n, "max", s->max, any);
    n += put_num(buf + n, CKPT_STATS_JSON_MAX - n, "mean", ckpt_stats_mean(s), any);
    n += put_num(buf + n, CKPT_STATS_JSON_MAX - n, "std", ckpt_stats_std(s), any);
    n += put_num(buf + n, CKPT_STATS_JSON_MAX - n, "absmax", s->absmax, any);
    n += put_num(buf + n, CKPT_STATS_JSON_MAX - n, "l2norm", ckpt_stats_l2(s), true);
    return n;
}

/* The members of a mount's stats.json entry at a width known before any statistic is: every
 * count right-aligned in 20 characters (any uint64), every figure in 24 (any %.17g double, or
 * null), so the file's size is right before its first read (tar and rsync copy what stat says);
 * JSON takes the spaces. fixed_width() is the length of every such members text. */
enum { COUNT_W = 20, FIGURE_W = 24 };
static const char *const COUNT_KEYS[] = {"count", "finite", "nan", "posinf", "neginf", "zeros"};
static const char *const FIGURE_KEYS[] = {"min", "max", "mean", "std", "absmax", "l2norm"};

static void put_fixed_members(strbuf *sb, const ckpt_stats *s) {
    uint64_t counts[6] = {s->count, s->finite, s->nan, s->posinf, s->neginf, s->zeros};
    bool any = s->finite > 0;
    double figures[6] = {s->min,    s->max,          ckpt_stats_mean(s), ckpt_stats_std(s),
                         s->absmax, ckpt_stats_l2(s)};
    bool defined[6] = {any, any, any, any, any, true};
    for (int i = 0; i < 6; i++)
        sb_printf(sb, "%s\"%s\": %*llu", i ? ", " : "", COUNT_KEYS[i], COUNT_W,
                  (unsigned long long)counts[i]);
    for (int i = 0; i < 6; i++) {
        if (!defined[i] || !isfinite(figures[i]))
            sb_printf(sb, ", \"%s\": %*s", FIGURE_KEYS[i], FIGURE_W, "null");
        else
            sb_printf(sb, ", \"%s\": %*.17g", FIGURE_KEYS[i], FIGURE_W, figures[i]);
    }
}

/* "error": MSG in the same width: the message cut (at a character) to fit, then spaces. */
static void put_fixed_error(strbuf *sb, const char *msg, size_t width) {
    size_t start = sb->len, n = strlen(msg);
    for (;;) {
        sb->len = start;
        sb_puts(sb, "\"error\": ");
        sb_json_str(sb, msg, n);
        if (sb->failed || sb->len - start <= width || n == 0) break;
        n = n > 8 ? n - 8 : 0;
        while (n && ((unsigned char)msg[n] & 0xC0) == 0x80) n--; /* not inside a UTF-8 char */
    }
    while (!sb->failed && sb->len - start < width) sb_putc(sb, ' ');
}

/* One tensor's entry of stats.json, with the separator before it; with fixed the members take
 * the fixed width (a mount's document), else the short form (ckptfs stats --json). */
static void put_entry_as(strbuf *sb, const ckpt_tensor *t, const ckpt_stats *s, int status,
                         const char *msg, bool first, bool fixed);

static void put_entry(strbuf *sb, const ckpt_tensor *t, const ckpt_stats *s, int status,
                      const char *msg, bool first) {
    put_entry_as(sb, t, s, status, msg, first, false);
}

static size_t fixed_width(void) {
    static size_t w;
    if (!w) { /* measured once: the members of an all-zero result */
        strbuf sb;
        sb_init(&sb);
        ckpt_stats zero;
        memset(&zero, 0, sizeof zero);
        put_fixed_members(&sb, &zero);
        w = sb.len;
        sb_free(&sb);
    }
    return w;
}

static void put_entry_as(strbuf *sb, const ckpt_tensor *t, const ckpt_stats *s, int status,
                         const char *msg, bool first, bool fixed) {
    sb_puts(sb, first ? "\n {\"name\": " : ",\n {\"name\": ");
    sb_json_str(sb, t->name, t->name_len);
    if (t->prefix) {
        sb_puts(sb, ", \"prefix\": ");
        sb_json_str(sb, t->prefix, strlen(t->prefix));
    }
    sb_printf(sb, ", \"dtype\": \"%s\", \"shape\": [", ckpt_dtype_info_of(t->dtype)->name);
    for (uint32_t d = 0; d < t->ndim; d++)
        sb_printf(sb, "%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
    sb_puts(sb, "], ");
    if (fixed) {
        if (status)
            put_fixed_error(sb, msg ? msg : strerror(-status), fixed_width());
        else if (s)
            put_fixed_members(sb, s);
        else /* not computed yet: only measured */
            for (size_t k = fixed_width(); k; k--) sb_putc(sb, ' ');
    } else if (status) {
        sb_puts(sb, "\"error\": ");
        const char *m = msg ? msg : strerror(-status);
        sb_json_str(sb, m, strlen(m));
    } else {
        char members[CKPT_STATS_JSON_MAX];
        sb_put(sb, members, ckpt_stats_json_members(s, members));
    }
    sb_putc(sb, '}');
}

static const char DOC_HEAD[] = "{\"tensors\": [", DOC_TAIL[] = "\n]}\n";

char *ckpt_stats_document(const ckpt_tensor *const *t, const ckpt_stats *s, const int *status,
                          const ckpt_err *msgs, size_t n, size_t *len) {
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, DOC_HEAD);
    for (size_t i = 0; i < n; i++)
        put_entry(&sb, t[i], &s[i], status[i], msgs ? msgs[i].msg : NULL, i == 0);
    sb_puts(&sb, DOC_TAIL);
    return sb_take(&sb, len);
}

/* ---- stats.json in pages ---- */

typedef struct failed_tensor {
    size_t index;
    char *msg;
} failed_tensor;

struct ckpt_stats_pages {
    const ckpt_catalog *cat;
    const ckpt_stats *s;
    size_t npages;
    uint64_t *start;       /* npages + 1: where each page's text starts, then the document's size */
    failed_tensor *failed; /* by index: the tensors whose entry is an error */
    size_t nfailed;
};

static const failed_tensor *failure_of(const ckpt_stats_pages *p, size_t i) {
    size_t lo = 0, hi = p->nfailed;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->failed[mid].index < i)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < p->nfailed && p->failed[lo].index == i ? &p->failed[lo] : NULL;
}

/* Page k's text, appended to sb (with p->s NULL: of the right length, to measure it). */
static void put_page(const ckpt_stats_pages *p, size_t k, strbuf *sb) {
    size_t n = p->cat->ntensors, first = k * CKPT_STATS_PAGE;
    size_t end = first + CKPT_STATS_PAGE < n ? first + CKPT_STATS_PAGE : n;
    if (k == 0) sb_puts(sb, DOC_HEAD);
    for (size_t i = first; i < end; i++) {
        const failed_tensor *f = p->s ? failure_of(p, i) : NULL;
        put_entry_as(sb, &p->cat->tensors[i], p->s ? &p->s[i] : NULL, f ? -EIO : 0,
                     f ? f->msg : NULL, i == 0, true);
    }
    if (k + 1 == p->npages) sb_puts(sb, DOC_TAIL);
}

uint64_t ckpt_stats_pages_size_of(const ckpt_catalog *cat) {
    ckpt_stats_pages p = {.cat = cat};
    size_t n = cat->ntensors;
    p.npages = n ? (n + CKPT_STATS_PAGE - 1) / CKPT_STATS_PAGE : 1;
    strbuf sb;
    sb_init(&sb);
    uint64_t at = 0;
    for (size_t k = 0; k < p.npages && !sb.failed; k++) {
        sb_clear(&sb);
        put_page(&p, k, &sb);
        at += sb.len;
    }
    bool failed = sb.failed;
    sb_free(&sb);
    return failed ? 0 : at;
}

void ckpt_stats_pages_free(ckpt_stats_pages *p) {
    if (!p) return;
    for (size_t i = 0; i < p->nfailed; i++) free(p->failed[i].msg);
    free(p->failed);
    free(p->start);
    free(p);
}

ckpt_stats_pages *ckpt_stats_pages_new(const ckpt_catalog *cat, const ckpt_stats *s,
                                       const int *status, const ckpt_err *msgs) {
    ckpt_stats_pages *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->cat = cat;
    p->s = s;
    size_t n = cat->ntensors;
    p->npages = n ? (n + CKPT_STATS_PAGE - 1) / CKPT_STATS_PAGE : 1;
    for (size_t i = 0; i < n; i++) p->nfailed += status[i] != 0;
    p->start = malloc((p->npages + 1) * sizeof *p->start);
    p->failed = calloc(p->nfailed ? p->nfailed : 1, sizeof *p->failed);
    bool ok = p->start && p->failed;
    for (size_t i = 0, k = 0; ok && i < n; i++) {
        if (!status[i]) continue;
        const char *m = msgs ? msgs[i].msg : strerror(-status[i]);
        p->failed[k] = (failed_tensor){i, strdup(m)};
        ok = p->failed[k++].msg != NULL;
    }
    strbuf sb;
    sb_init(&sb);
    uint64_t at = 0;
    for (size_t k = 0; ok && k < p->npages; k++) {
        p->start[k] = at;
        sb_clear(&sb);
        put_page(p, k, &sb);
        ok = !sb.failed;
        at += sb.len;
    }
    sb_free(&sb);
    if (!ok) {
        ckpt_stats_pages_free(p);
        return NULL;
    }
    p->start[p->npages] = at;
    return p;
}

uint64_t ckpt_stats_pages_size(const ckpt_stats_pages *p) {
    return p->start[p->npages];
}

ssize_t ckpt_stats_pages_read(const ckpt_stats_pages *p, uint64_t off, char *dst, size_t len) {
    uint64_t size = ckpt_stats_pages_size(p);
    if (off >= size || len == 0) return 0;
    if (len > size - off) len = (size_t)(size - off);
    size_t lo = last_at_or_before(p->start, p->npages, off);
    strbuf sb;
    sb_init(&sb);
    size_t done = 0;
    for (size_t k = lo; k < p->npages && done < len; k++) {
        sb_clear(&sb);
        put_page(p, k, &sb);
        if (sb.failed) break;
        uint64_t skip = off + done - p->start[k];
        size_t take = sb.len - (size_t)skip < len - done ? sb.len - (size_t)skip : len - done;
        memcpy(dst + done, sb.data + skip, take);
        done += take;
    }
    bool failed = sb.failed;
    sb_free(&sb);
    return failed ? -ENOMEM : (ssize_t)done;
}
