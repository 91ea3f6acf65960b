/* Statistics of tensor values and differences between two tensors, streamed through the
 * planner on all cores (see stats.c). Public: fs/ and the tests use only this header and ckpt.h.
 *
 * Every value is converted to double first (exact for every supported dtype but 64-bit
 * integers beyond 2^53). NaN and infinities are counted and kept out of every other figure. */
#ifndef CKPT_STATS_H
#define CKPT_STATS_H

#include "../ckpt.h"

#include <sys/types.h>

/* What one tensor's values sum up to. The derived figures are ckpt_stats_mean/std/l2. */
typedef struct ckpt_stats {
    uint64_t count; /* elements */
    uint64_t finite, nan, posinf, neginf, zeros;
    double min, max, absmax; /* over finite values; meaningless when finite == 0 */
    double sum, sumsq;       /* of finite values: pairwise sums in double */
    double m2;               /* sum of squared deviations from the mean (Chan et al.) */
} ckpt_stats;

double ckpt_stats_mean(const ckpt_stats *s);
double ckpt_stats_std(const ckpt_stats *s); /* population (ddof 0), as numpy.std */
double ckpt_stats_l2(const ckpt_stats *s);

/* A against B, element by element in row-major order, B being the reference (numpy.isclose). */
typedef struct ckpt_diff {
    uint64_t count;               /* element pairs compared */
    bool bytes_identical;         /* every byte equal (or the same file range: not read at all) */
    bool not_read;                /* the fast path: both name the same bytes of the same file */
    bool bytes_only;              /* a dtype whose values are not decoded (F4, F6, complex, some
                                     ggml types) on both sides: beyond counts differing bytes */
    uint64_t beyond;              /* |a-b| > atol + rtol*|b|, or a non-finite mismatch */
    uint64_t nonfinite;           /* pairs where a or b is NaN or infinite */
    uint64_t nonfinite_mismatch;  /* of those, not the same value (NaN vs NaN counts as same) */
    double max_abs, max_rel;      /* over finite pairs; rel skips b == 0 */
    double sumsq_diff;            /* sum (a-b)^2 over finite pairs: RMS = sqrt(sumsq_diff/n) */
    double dot, sumsq_a, sumsq_b; /* cosine = dot / sqrt(sumsq_a * sumsq_b) */
} ckpt_diff;

double ckpt_diff_rms(const ckpt_diff *d);
double ckpt_diff_cosine(const ckpt_diff *d); /* NaN when a side is all zeros */
/* ||a-b|| / ||b||, the relative change plotted per layer; NaN when ||b|| is 0. */
double ckpt_diff_relative(const ckpt_diff *d);

/* Dtypes whose values the statistics can read: integers, BOOL, F16, BF16, F32, F64, the two
 * float8 formats and the ggml block types core/read/dequant.c converts. */
bool ckpt_stats_supported(ckpt_dtype dt);

/* Called from the worker threads (one at a time) after each unit of work with the bytes read. */
typedef void (*ckpt_stats_progress)(void *ctx, uint64_t bytes);

/* Statistics of n tensors of cat, computed on `threads` threads (0 = one per CPU). status[i]
 * is 0, or a negative errno for a tensor that could not be read (-ENOTSUP for a dtype not
 * supported, -EIO for a hole): its message goes to msgs[i] when msgs is not NULL (each
 * ckpt_err). Returns 0 or -ENOMEM. Memory is independent of tensor sizes. */
int ckpt_stats_run(const ckpt_catalog *cat, const ckpt_tensor *const *t, size_t n, unsigned threads,
                   ckpt_stats *out, int *status, ckpt_err *msgs, ckpt_stats_progress progress,
                   void *ctx);

/* Differences of pairs a[i] (in ca) and b[i] (in cb) with equal numel. Pairs of one dtype
 * whose values cannot be decoded are compared byte by byte (bytes_only). */
int ckpt_diff_run(const ckpt_catalog *ca, const ckpt_tensor *const *a, const ckpt_catalog *cb,
                  const ckpt_tensor *const *b, size_t n, double atol, double rtol, unsigned threads,
                  ckpt_diff *out, int *status, ckpt_err *msgs, ckpt_stats_progress progress,
                  void *ctx);

/* Counts of finite values in nbins equal bins over [lo, hi] (the last bin closed). */
int ckpt_stats_histogram(const ckpt_catalog *cat, const ckpt_tensor *t, double lo, double hi,
                         size_t nbins, uint64_t *bins, ckpt_err *err);

/* `"count": N, "nan": N, ..., "l2norm": X` (JSON members, no braces) into buf; non-finite and
 * undefined figures are null. Returns the length (buf holds CKPT_STATS_JSON_MAX). */
enum { CKPT_STATS_JSON_MAX = 640 };
size_t ckpt_stats_json_members(const ckpt_stats *s, char *buf);

/* .ckptfs/stats.json: {"tensors": [{"name", "dtype", "shape", members | "error"}...]} for the
 * given results (malloc'd, NULL on ENOMEM). */
char *ckpt_stats_document(const ckpt_tensor *const *t, const ckpt_stats *s, const int *status,
                          const ckpt_err *msgs, size_t n, size_t *len);

/* .ckptfs/stats.json of every tensor of cat without holding its text: ckpt_stats_document's
 * entries with their members at a fixed width (counts in 20 characters, figures in 24, an
 * error cut to the same width), so its size is known before anything is computed
 * (ckpt_stats_pages_size_of). It is rendered a page of CKPT_STATS_PAGE tensors at a time when
 * read, from the results s (which must outlive it and not change) and the messages of the
 * tensors that failed (kept). It holds 8 bytes a page and those messages. */
enum { CKPT_STATS_PAGE = 256 };
typedef struct ckpt_stats_pages ckpt_stats_pages;
ckpt_stats_pages *ckpt_stats_pages_new(const ckpt_catalog *cat, const ckpt_stats *s,
                                       const int *status, const ckpt_err *msgs);
uint64_t ckpt_stats_pages_size(const ckpt_stats_pages *p);
/* The size the pages of cat's statistics will have, without computing any (0 on ENOMEM). */
uint64_t ckpt_stats_pages_size_of(const ckpt_catalog *cat);
/* Bytes [off, off + len) of the document into dst: how many (0 past its end), or -ENOMEM. */
ssize_t ckpt_stats_pages_read(const ckpt_stats_pages *p, uint64_t off, char *dst, size_t len);
void ckpt_stats_pages_free(ckpt_stats_pages *p);

#endif
