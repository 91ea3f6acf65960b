#include "strided.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

enum {
    BAND_BYTES = 16 << 20, /* logical bytes materialized at once */
    BANDS = 2,             /* bands kept, for the whole process */
    /* Bytes between two wanted runs of the file that are cheaper to read and drop than to
     * skip with another pread (a call costs about as much as copying this much). */
    GAP_READ = 4 << 10,
    /* One step of the file's outermost dimension spanning more than this (a permutation that
     * leaves two dimensions far apart): read element by element rather than buffer it. */
    FOOTPRINT_MAX = 64 << 20,
    TILE = 16, /* elements on a side of the blocks copied */
    /* A band is filled in chunks of this many file bytes, shared among the calling thread and
     * up to FILL_WORKERS_MAX workers (one per other core). */
    FILL_CHUNK = 1 << 20,
    FILL_WORKERS_MAX = 3,
};

/* Everything the bytes of a band depend on: the same key is the same bytes, whichever catalog
 * (or reopened catalog) asks. */
typedef struct band_key {
    const char *path;
    dev_t dev;
    ino_t ino;
    int64_t mtime_s, mtime_ns, ctime_s, ctime_ns; /* ctime: a rewrite that put mtime back */
    uint64_t size, base, file_offset, start, len;
    uint32_t esz, nd;
    uint64_t dims[4 * CKPT_MAX_DIMS]; /* shape, piece offsets, sizes, strides: nd each */
} band_key;

/* A band: logical bytes [start, start+len) of the tensor, whole rows of dimension q; the part
 * of it inside the piece is the box lo[d], n[d]. */
typedef struct band {
    uint64_t start, len;
    uint64_t lo[CKPT_MAX_DIMS], n[CKPT_MAX_DIMS];
    bool empty;
} band;

static int read_exact(const ckpt_source *s, unsigned char *dst, uint64_t off, uint64_t len) {
    for (uint64_t got = 0; got < len;) {
        ssize_t r = ckpt_source_pread(s, dst + got, (size_t)(len - got), off + got);
        if (r < 0) return (int)r;
        if (r == 0) return -EIO; /* the source shrank */
        got += (uint64_t)r;
    }
    return 0;
}

/* The band holding logical byte pos. inner[d]: bytes of one step of dimension d. */
static void band_of(const ckpt_tensor *t, const ckpt_piece *p, const uint64_t *inner, uint64_t pos,
                    band *b) {
    uint32_t nd = t->ndim, q = 0;
    while (q + 1 < nd && inner[q] > BAND_BYTES) q++;
    uint64_t m = inner[q] > BAND_BYTES ? 1 : BAND_BYTES / inner[q];
    if (m > t->shape[q]) m = t->shape[q];
    uint64_t e = pos / inner[q], iq = e % t->shape[q], outer = e / t->shape[q];
    uint64_t first = iq / m * m, rows = t->shape[q] - first < m ? t->shape[q] - first : m;
    b->start = (e - iq + first) * inner[q];
    b->len = rows * inner[q];
    b->empty = false;
    for (uint32_t d = nd; d-- > 0;) {
        uint64_t lo = 0, hi = t->shape[d];
        if (d < q) {
            lo = outer % t->shape[d];
            outer /= t->shape[d];
            hi = lo + 1;
        } else if (d == q) {
            lo = first;
            hi = first + rows;
        }
        uint64_t plo = p->offsets[d], phi = plo + p->sizes[d];
        if (lo < plo) lo = plo;
        if (hi > phi) hi = phi;
        if (lo >= hi) b->empty = true;
        b->lo[d] = lo;
        b->n[d] = lo < hi ? hi - lo : 0;
    }
}

/* One row of n elements of esz bytes, src elements ss bytes apart, dst packed. */
static void copy_row(unsigned char *dst, const unsigned char *src, uint64_t n, uint64_t ss,
                     uint64_t esz) {
    switch (esz) {
    case 1:
        for (uint64_t i = 0; i < n; i++) dst[i] = src[i * ss];
        break;
    case 2:
        for (uint64_t i = 0; i < n; i++) memcpy(dst + 2 * i, src + i * ss, 2);
        break;
    case 4:
        for (uint64_t i = 0; i < n; i++) memcpy(dst + 4 * i, src + i * ss, 4);
        break;
    case 8:
        for (uint64_t i = 0; i < n; i++) memcpy(dst + 8 * i, src + i * ss, 8);
        break;
    default:
        for (uint64_t i = 0; i < n; i++) memcpy(dst + esz * i, src + i * ss, esz);
    }
}

/* Rows [r0, r1) x columns [k0, k1) of the copy_tiled below, element by element. */
static void copy_rect(unsigned char *dst, const unsigned char *src, uint64_t r0, uint64_t r1,
                      uint64_t k0, uint64_t k1, uint64_t drs, uint64_t srs, uint64_t scs,
                      uint64_t esz) {
    if (k0 < k1)
        for (uint64_t r = r0; r < r1; r++)
            copy_row(dst + r * drs + k0 * esz, src + r * srs + k0 * scs, k1 - k0, scs, esz);
}

#ifdef __SSE2__
/* A true transpose of 2- or 4-byte elements (src rows packed, dst rows packed): square blocks
 * through vector registers, 8 or 4 elements a load instead of one. */
static void transpose4(unsigned char *dst, const unsigned char *src, uint64_t drs, uint64_t scs) {
    __m128i a0 = _mm_loadu_si128((const __m128i *)(const void *)src);
    __m128i a1 = _mm_loadu_si128((const __m128i *)(const void *)(src + scs));
    __m128i a2 = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * scs));
    __m128i a3 = _mm_loadu_si128((const __m128i *)(const void *)(src + 3 * scs));
    __m128i t0 = _mm_unpacklo_epi32(a0, a1), t1 = _mm_unpacklo_epi32(a2, a3);
    __m128i t2 = _mm_unpackhi_epi32(a0, a1), t3 = _mm_unpackhi_epi32(a2, a3);
    _mm_storeu_si128((__m128i *)(void *)dst, _mm_unpacklo_epi64(t0, t1));
    _mm_storeu_si128((__m128i *)(void *)(dst + drs), _mm_unpackhi_epi64(t0, t1));
    _mm_storeu_si128((__m128i *)(void *)(dst + 2 * drs), _mm_unpacklo_epi64(t2, t3));
    _mm_storeu_si128((__m128i *)(void *)(dst + 3 * drs), _mm_unpackhi_epi64(t2, t3));
}

static void transpose8(unsigned char *dst, const unsigned char *src, uint64_t drs, uint64_t scs) {
    __m128i a[8], t[8], u[8];
    for (int i = 0; i < 8; i++)
        a[i] = _mm_loadu_si128((const __m128i *)(const void *)(src + (uint64_t)i * scs));
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) { /* pairs (0,2) (1,3) then (4,6) (5,7) */
        u[4 * i] = _mm_unpacklo_epi32(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm_unpackhi_epi32(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm_unpacklo_epi32(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm_unpackhi_epi32(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        _mm_storeu_si128((__m128i *)(void *)(dst + (uint64_t)(2 * i) * drs),
                         _mm_unpacklo_epi64(u[i], u[i + 4]));
        _mm_storeu_si128((__m128i *)(void *)(dst + (uint64_t)(2 * i + 1) * drs),
                         _mm_unpackhi_epi64(u[i], u[i + 4]));
    }
}
#endif

/* rows x cols elements: row r, column k from src + r * srs + k * scs to dst + r * drs + k * esz.
 * In TILE x TILE blocks, so each block reads and writes whole cache lines on few pages, however
 * far apart the rows lie. */
static void copy_tiled(unsigned char *dst, const unsigned char *src, uint64_t rows, uint64_t cols,
                       uint64_t drs, uint64_t srs, uint64_t scs, uint64_t esz) {
    uint64_t vec = 0; /* side of the vector blocks, 0: none */
#ifdef __SSE2__
    if (srs == esz && (esz == 4 || esz == 2)) vec = 16 / esz;
#endif
    for (uint64_t r0 = 0; r0 < rows; r0 += TILE) {
        uint64_t r1 = rows - r0 < TILE ? rows : r0 + TILE;
        for (uint64_t k0 = 0; k0 < cols; k0 += TILE) {
            uint64_t k1 = cols - k0 < TILE ? cols : k0 + TILE;
            if (!vec) {
                copy_rect(dst, src, r0, r1, k0, k1, drs, srs, scs, esz);
                continue;
            }
#ifdef __SSE2__
            uint64_t rv = r0 + (r1 - r0) / vec * vec, kv = k0 + (k1 - k0) / vec * vec;
            for (uint64_t r = r0; r < rv; r += vec)
                for (uint64_t k = k0; k < kv; k += vec) {
                    unsigned char *d = dst + r * drs + k * esz;
                    const unsigned char *sp = src + r * srs + k * scs;
                    if (vec == 4)
                        transpose4(d, sp, drs, scs);
                    else
                        transpose8(d, sp, drs, scs);
                }
            copy_rect(dst, src, r0, rv, kv, k1, drs, srs, scs, esz);
            copy_rect(dst, src, rv, r1, k0, k1, drs, srs, scs, esz);
#endif
        }
    }
}

/* The box of c[d] elements from src (byte strides ss) to dst (byte strides ds, the last
 * dimension packed): an odometer over the outer dimensions, the last two copied in tiles. */
static void gather(unsigned char *dst, const unsigned char *src, uint32_t nd, const uint64_t *c,
                   const uint64_t *ds, const uint64_t *ss) {
    uint32_t last = nd - 1;
    if (nd == 1) {
        copy_row(dst, src, c[0], ss[0], ds[0]);
        return;
    }
    uint32_t row = nd - 2;
    uint64_t at[CKPT_MAX_DIMS] = {0};
    for (;;) {
        copy_tiled(dst, src, c[row], c[last], ds[row], ss[row], ss[last], ds[last]);
        uint32_t d = row;
        for (;;) {
            if (d == 0) return;
            d--;
            if (++at[d] < c[d]) {
                dst += ds[d];
                src += ss[d];
                break;
            }
            dst -= (c[d] - 1) * ds[d];
            src -= (c[d] - 1) * ss[d];
            at[d] = 0;
        }
    }
}

/* The slow way, for footprints too wide to buffer: one read per element. */
static int fill_elementwise(const ckpt_source *s, uint32_t nd, const uint64_t *n, uint64_t fbase,
                            const uint64_t *fs, unsigned char *dst, const uint64_t *ds,
                            uint64_t esz) {
    uint64_t at[CKPT_MAX_DIMS] = {0}, fo = fbase;
    for (;;) {
        int e = read_exact(s, dst, fo, esz);
        if (e) return e;
        uint32_t d = nd;
        for (;;) {
            if (d == 0) return 0;
            d--;
            if (++at[d] < n[d]) {
                dst += ds[d];
                fo += fs[d];
                break;
            }
            dst -= (n[d] - 1) * ds[d];
            fo -= (n[d] - 1) * fs[d];
            at[d] = 0;
        }
    }
}

/* A band's fill cut into chunks of steps of its outermost file dimension D: each chunk is read
 * into a scratch buffer and gathered into the band on its own, so the chunks of one band are
 * shared out among the calling thread and the fill workers. */
typedef struct fill_job {
    const ckpt_source *s;
    uint32_t nd, D;
    uint64_t c[CKPT_MAX_DIMS], ss[CKPT_MAX_DIMS]; /* the band's box, its file strides */
    const uint64_t *inner;
    unsigned char *out; /* where step 0 of D lands */
    uint64_t fbase, step, rest, per, steps;
    size_t cap;
    bool dense;
    uint64_t next;   /* the next chunk to take (under pool.lock) */
    unsigned active; /* workers inside the job */
    int err;         /* the first failure */
} fill_job;

/* Chunk k of the job, with buf (job->cap bytes) to read into. */
static int fill_chunk(const fill_job *j, uint64_t k, unsigned char *buf) {
    uint64_t a = k * j->per, mc = j->steps - a < j->per ? j->steps - a : j->per;
    uint64_t c[CKPT_MAX_DIMS], ss[CKPT_MAX_DIMS];
    memcpy(c, j->c, j->nd * sizeof *c);
    memcpy(ss, j->ss, j->nd * sizeof *ss);
    int e = 0;
    if (j->dense) {
        e = read_exact(j->s, buf, j->fbase + a * j->step,
                       j->step ? (mc - 1) * j->step + j->rest : j->rest);
    } else {
        for (uint64_t i = 0; i < mc && !e; i++)
            e = read_exact(j->s, buf + i * j->rest, j->fbase + (a + i) * j->step, j->rest);
        ss[j->D] = j->rest;
    }
    if (e) return e;
    c[j->D] = mc;
    gather(j->out + a * j->inner[j->D], buf, j->nd, c, j->inner, ss);
    return 0;
}

/* ---- fill workers: one per other core, started on the first band that has chunks to share
 * (never before: a daemon forks after opening its catalog, and threads do not survive it) ---- */

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    fill_job *job; /* the band being shared out; one at a time, others fill alone */
    unsigned workers;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER,
          .work = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER};

/* Takes and fills chunks of j until none is left; under pool.lock, which it drops meanwhile. */
static void take_chunks(fill_job *j, unsigned char *buf) {
    while (j->next * j->per < j->steps) {
        uint64_t k = j->next++;
        if (j->err) continue; /* a chunk failed: the rest are passed over */
        pthread_mutex_unlock(&pool.lock);
        int e = fill_chunk(j, k, buf);
        pthread_mutex_lock(&pool.lock);
        if (e && !j->err) j->err = e;
    }
}

static void *fill_worker(void *arg) {
    (void)arg;
    unsigned char *buf = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        fill_job *j = pool.job;
        if (!j || j->next * j->per >= j->steps) {
            pthread_cond_wait(&pool.work, &pool.lock);
            continue;
        }
        if (cap < j->cap) { /* a worker's scratch, kept: allocated under the lock, rarely */
            free(buf);
            cap = (buf = malloc(j->cap)) ? j->cap : 0;
            if (!buf) { /* no memory: the band's own thread does the chunks */
                pthread_cond_wait(&pool.work, &pool.lock);
                continue;
            }
        }
        j->active++;
        take_chunks(j, buf);
        if (--j->active == 0) pthread_cond_broadcast(&pool.done);
    }
    return NULL;
}

static void pool_after_fork_child(void) {
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.work, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.job = NULL;
    pool.workers = 0;
}

/* Under pool.lock. */
static void pool_start(void) {
    static bool hooked;
    if (!hooked) {
        hooked = true;
        pthread_atfork(NULL, NULL, pool_after_fork_child);
    }
    if (pool.workers) return;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned want = cpus <= 1                     ? 0
                    : cpus - 1 > FILL_WORKERS_MAX ? FILL_WORKERS_MAX
                                                  : (unsigned)cpus - 1;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* signals stay with the FUSE loop's threads */
    for (unsigned i = 0; i < want; i++) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &at, fill_worker, NULL) == 0) pool.workers++;
        pthread_attr_destroy(&at);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static bool workers_allowed; /* strided_workers_allow was called */

void strided_workers_allow(void) {
    pthread_mutex_lock(&pool.lock);
    workers_allowed = true;
    pthread_mutex_unlock(&pool.lock);
}

/* Every chunk of j filled, by this thread (into buf) and whatever workers are free. */
static int fill_shared(fill_job *j, unsigned char *buf) {
    uint64_t chunks = (j->steps + j->per - 1) / j->per;
    if (chunks < 2) return fill_chunk(j, 0, buf);
    pthread_mutex_lock(&pool.lock);
    bool shared = !pool.job && workers_allowed;
    if (shared) {
        pool_start();
        pool.job = j;
        pthread_cond_broadcast(&pool.work);
    }
    take_chunks(j, buf);
    if (shared) {
        while (j->active) pthread_cond_wait(&pool.done, &pool.lock);
        pool.job = NULL;
    }
    pthread_mutex_unlock(&pool.lock);
    return j->err;
}

/* The piece's elements of band b into out (b->len bytes, indexed by logical offset). The
 * footprint is walked along the dimension with the largest file stride, a chunk of its steps at
 * a time: one read for the chunk when the steps lie densely, else one per step. */
static int fill_band(const ckpt_catalog *cat, const ckpt_tensor *t, const ckpt_piece *p,
                     const uint64_t *inner, const band *b, unsigned char *out, char *scratch) {
    uint32_t nd = t->ndim;
    uint64_t esz = inner[nd - 1], st[CKPT_MAX_DIMS], acc = 1;
    for (uint32_t d = nd; d-- > 0;) {
        st[d] = (p->strides ? p->strides[d] : acc) * esz;
        acc *= p->sizes[d];
    }
    uint64_t fbase = p->file_offset, dbase = 0;
    uint32_t D = nd - 1;
    for (uint32_t d = 0; d < nd; d++) {
        fbase += (b->lo[d] - p->offsets[d]) * st[d];
        dbase += b->lo[d] * inner[d];
        if (b->n[d] > 1 && (b->n[D] <= 1 || st[d] > st[D])) D = d;
    }
    dbase -= b->start;
    const ckpt_source *s = &cat->sources[p->source];
    uint64_t rest = esz; /* file bytes of one step of D */
    for (uint32_t d = 0; d < nd; d++)
        if (d != D) rest += (b->n[d] - 1) * st[d];
    if (rest > FOOTPRINT_MAX)
        return fill_elementwise(s, nd, b->n, fbase, st, out + dbase, inner, esz);

    fill_job j = {.s = s,
                  .nd = nd,
                  .D = D,
                  .inner = inner,
                  .out = out + dbase,
                  .fbase = fbase,
                  .step = st[D],
                  .rest = rest,
                  .steps = b->n[D],
                  .cap = FILL_CHUNK};
    memcpy(j.c, b->n, nd * sizeof *j.c);
    memcpy(j.ss, st, nd * sizeof *j.ss);
    if (rest > j.cap) j.cap = (size_t)rest;
    j.dense = j.step <= rest + GAP_READ;
    /* stride 0 (broadcast): every step reads the same bytes, one chunk does */
    j.per = j.dense ? (j.step ? 1 + (j.cap - rest) / j.step : j.steps) : j.cap / rest;
    unsigned char *buf = (unsigned char *)scratch, *own = NULL;
    if (!buf || j.cap > STRIDED_SCRATCH) {
        if (!(buf = own = malloc(j.cap))) return -ENOMEM;
    }
    int e = fill_shared(&j, buf);
    free(own);
    return e;
}

/* ---- the band cache, shared by every thread ---- */

typedef enum { SLOT_EMPTY, SLOT_LOADING, SLOT_READY } slot_state;

typedef struct slot {
    band_key key;
    slot_state state;
    unsigned refs; /* readers copying out of it (and its loader) */
    uint64_t used;
    unsigned char *data;
    size_t cap;
} slot;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t loaded;
    slot slots[BANDS];
    uint64_t clock;
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER, .loaded = PTHREAD_COND_INITIALIZER};

static void key_of(const ckpt_catalog *cat, const ckpt_tensor *t, const ckpt_piece *p, uint64_t esz,
                   const band *b, band_key *k) {
    const ckpt_source *s = &cat->sources[p->source];
    memset(k, 0, sizeof *k); /* padding too: keys are compared with memcmp */
    k->path = s->path;
    k->dev = s->dev;
    k->ino = s->ino;
    k->mtime_s = s->mtime.tv_sec;
    k->mtime_ns = s->mtime.tv_nsec;
    k->ctime_s = s->ctime.tv_sec;
    k->ctime_ns = s->ctime.tv_nsec;
    k->size = s->size;
    k->base = s->base;
    k->file_offset = p->file_offset;
    k->start = b->start;
    k->len = b->len;
    k->esz = (uint32_t)esz;
    uint32_t nd = k->nd = t->ndim;
    for (uint32_t d = 0; d < nd; d++) {
        k->dims[d] = t->shape[d];
        k->dims[nd + d] = p->offsets[d];
        k->dims[2 * nd + d] = p->sizes[d];
        k->dims[3 * nd + d] = p->strides ? p->strides[d] : UINT64_MAX; /* row-major */
    }
}

static slot *slot_find(const band_key *k) {
    for (int i = 0; i < BANDS; i++) {
        slot *s = &cache.slots[i];
        if (s->state != SLOT_EMPTY && memcmp(&s->key, k, sizeof *k) == 0) return s;
    }
    return NULL;
}

/* The least recently used slot no one reads, one that holds memory before an empty one: a
 * sequential reader then fills one band's memory again and again, and a fresh band's first
 * touch (zeroed pages: a third of a first read's time) is paid once, not once per slot. NULL
 * when all are busy. */
static slot *slot_claim(void) {
    slot *v = NULL;
    for (int i = 0; i < BANDS; i++) {
        slot *s = &cache.slots[i];
        bool idle = s->state == SLOT_EMPTY || (s->state == SLOT_READY && !s->refs);
        if (idle && (!v || (s->cap != 0) > (v->cap != 0) ||
                     ((s->cap != 0) == (v->cap != 0) && s->used < v->used)))
            v = s;
    }
    return v;
}

/* A band's memory: in huge pages where the kernel has them, so filling a fresh band costs a
 * few page faults rather than one per 4 KiB (a third of a first read's time otherwise). */
static unsigned char *band_alloc(size_t len) {
    enum { HUGE = 2 << 20 };
    if (len < HUGE) return malloc(len);
    void *p;
    if (posix_memalign(&p, HUGE, (len + HUGE - 1) / HUGE * HUGE)) return NULL;
    madvise(p, len, MADV_HUGEPAGE); /* a hint: without it, ordinary pages */
    return p;
}

/* Bytes [from, from+len) of band b (from relative to the band) into dst. */
static int read_band(const ckpt_catalog *cat, const ckpt_tensor *t, const ckpt_piece *p,
                     const uint64_t *inner, const band *b, uint64_t from, char *dst, size_t len,
                     char *scratch) {
    band_key key;
    key_of(cat, t, p, inner[t->ndim - 1], b, &key);
    pthread_mutex_lock(&cache.lock);
    slot *s;
    for (;;) {
        while ((s = slot_find(&key)) && s->state == SLOT_LOADING)
            pthread_cond_wait(&cache.loaded, &cache.lock);
        if (s) {
            s->refs++;
            s->used = ++cache.clock;
            pthread_mutex_unlock(&cache.lock);
            memcpy(dst, s->data + from, len);
            pthread_mutex_lock(&cache.lock);
            if (--s->refs == 0) pthread_cond_broadcast(&cache.loaded);
            pthread_mutex_unlock(&cache.lock);
            return 0;
        }
        if ((s = slot_claim())) break;
        /* Every band is being filled or copied from, for a moment: wait for one rather than
         * fill a private band (16 MiB allocated and touched per READ). */
        pthread_cond_wait(&cache.loaded, &cache.lock);
    }
    s->key = key;
    s->state = SLOT_LOADING;
    s->refs = 1;
    s->used = ++cache.clock;
    pthread_mutex_unlock(&cache.lock);
    if (s->cap < b->len) {
        free(s->data);
        s->data = NULL;
        s->cap = 0;
        if ((s->data = band_alloc(b->len))) s->cap = b->len;
    }
    int e = s->data ? fill_band(cat, t, p, inner, b, s->data, scratch) : -ENOMEM;
    if (!e) memcpy(dst, s->data + from, len);
    pthread_mutex_lock(&cache.lock);
    s->refs--;
    s->state = e ? SLOT_EMPTY : SLOT_READY;
    pthread_cond_broadcast(&cache.loaded);
    pthread_mutex_unlock(&cache.lock);
    return e;
}

int strided_read(const ckpt_catalog *cat, const ckpt_segment *seg, char *dst, char *scratch) {
    const ckpt_tensor *t = seg->mem;
    if (!t || seg->piece >= t->npieces || !t->ndim) return -EIO;
    const ckpt_piece *p = &t->pieces[seg->piece];
    uint64_t esz = ckpt_dtype_elem_size(t->dtype), inner[CKPT_MAX_DIMS];
    if (!esz || seg->offset > t->nbytes || seg->length > t->nbytes - seg->offset) return -EIO;
    inner[t->ndim - 1] = esz;
    for (uint32_t d = t->ndim - 1; d-- > 0;) inner[d] = inner[d + 1] * t->shape[d + 1];
    for (uint64_t pos = seg->offset, end = pos + seg->length; pos < end;) {
        band b;
        band_of(t, p, inner, pos, &b);
        if (b.empty) return -EIO; /* the planner gave bytes outside the piece */
        uint64_t from = pos - b.start, take = b.len - from;
        if (take > end - pos) take = end - pos;
        int e = read_band(cat, t, p, inner, &b, from, dst, (size_t)take, scratch);
        if (e) return e;
        dst += take;
        pos += take;
    }
    /* A band served from the cache was read before: the source must still be the file it was
     * then (a file rewritten in place gives EIO, as on every other read path). */
    return ckpt_source_unchanged(&cat->sources[p->source]) ? 0 : -EIO;
}
