/* Remote objects: pinned at open, read block by block through the block cache. */
#include "../blockcache.h"
#include "../../util/sha256.h"
#include "remote.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A reader moving forward through an object: where its next read should start, how many bytes
 * it has read in a row, and when it was last seen (the least recently seen slot is reused).
 * Several per object: two processes reading two tensors of one shard, or one reading a tensor
 * while another reads the header, each keep their own run. */
enum { STREAMS = 8 };
struct stream {
    uint64_t next, run, seen;
    uint64_t lowest;      /* the lowest offset it read: has it crossed a part's start? */
    uint64_t passed_next; /* the first block it has not told the cache it moved past */
};

struct remote_object {
    char *shown; /* the name messages use */
    remote_target target;
    uint64_t size;
    char etag[160];
    time_t mtime;
    uint64_t head_len, block_len; /* block 0 is head_len bytes, the others block_len */
    char disk_key[SHA256_HEX_LEN + 1];
    bc_source bc;
    _Atomic int refs;
    _Atomic bool changed;
    _Atomic bool logged;
    pthread_mutex_t streams_lock;
    struct stream streams[STREAMS];
    uint64_t stream_clock;
    /* Sorted part starts, and those of them a stream of many parts stops at too (a tar member's
     * end): remote_set_boundaries, under streams_lock. */
    uint64_t *bounds, *hard_bounds;
    size_t nbounds, nhard;
};

enum { HEAD_DEFAULT = 256 << 10, BLOCK_DEFAULT = 4 << 20 };

static struct {
    uint64_t block_len;
    unsigned prefetch;
    bool configured;
} conf = {BLOCK_DEFAULT, 4, false};
static _Atomic uint64_t next_id = 1, bytes_read, reads;
static _Thread_local char last_error[512];

const char *remote_last_error(void) {
    return last_error[0] ? last_error : "remote read failed";
}

int remote_configure(const ckpt_remote_options *o, ckpt_err *err) {
    static pthread_mutex_t once = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&once);
    bool first = !conf.configured;
    conf.configured = true;
    pthread_mutex_unlock(&once);
    remote_set_s3_options(o);
    if (!first) return 0;
    http_config hc = {.timeout = o->timeout ? o->timeout : 30,
                      .retries = o->retries || o->retries_set ? o->retries : 5,
                      .backoff_ms = 100};
    http_set_config(&hc);
    if (o->block_size) {
        if (o->block_size < 4096 || o->block_size > (1ull << 30))
            return ckpt_fail(err, -EINVAL, "block_size=%llu: expected 4 KiB to 1 GiB",
                             (unsigned long long)o->block_size);
        conf.block_len = o->block_size;
    }
    if (o->prefetch || o->prefetch_set) conf.prefetch = o->prefetch;
    if (conf.prefetch > 64) conf.prefetch = 64;
    bc_config bc = {.ram_cap = o->cache_ram ? o->cache_ram : 256ull << 20,
                    .disk_dir = o->cache_dir,
                    .disk_cap = o->cache_size,
                    .workers = conf.prefetch};
    /* At least the blocks in flight plus one being read must fit. */
    if (bc.ram_cap < (conf.prefetch + 2) * conf.block_len)
        bc.ram_cap = (conf.prefetch + 2) * conf.block_len;
    int rc = bc_configure(&bc);
    if (rc)
        return ckpt_fail(err, rc, "cache_dir=%s: %s", o->cache_dir ? o->cache_dir : "",
                         strerror(-rc));
    return 0;
}

static uint64_t block_start(const remote_object *o, uint64_t k) {
    return k == 0 ? 0 : o->head_len + (k - 1) * o->block_len;
}

static uint64_t block_of(const remote_object *o, uint64_t off) {
    return off < o->head_len ? 0 : 1 + (off - o->head_len) / o->block_len;
}

static size_t block_size_of(const remote_object *o, uint64_t k) {
    uint64_t s = block_start(o, k);
    uint64_t e = k == 0 ? o->head_len : s + o->block_len;
    if (e > o->size) e = o->size;
    return s < e ? (size_t)(e - s) : 0;
}

static const char *reason(long status) {
    switch (status) {
    case 401:
        return "unauthorized (credentials missing or refused)";
    case 403:
        return "access denied (check credentials and permissions)";
    case 404:
        return "not found";
    case 410:
        return "gone";
    case 416:
        return "range not satisfiable";
    default:
        return status >= 500 ? "server error" : "unexpected answer";
    }
}

/* The <Code> of an S3-style XML error body (NoSuchKey, NoSuchBucket, AccessDenied, ...), or "":
 * a 404 alone cannot tell a missing bucket from a missing key. */
static void error_code(const char *body, size_t len, char *out, size_t cap) {
    out[0] = '\0';
    const char *a = memmem(body, len, "<Code>", 6);
    if (!a) return;
    a += 6;
    const char *b = memmem(a, len - (size_t)(a - body), "</Code>", 7);
    size_t n = b ? (size_t)(b - a) : 0;
    if (!b || n == 0 || n >= cap) return;
    for (size_t i = 0; i < n; i++) /* a code is a word: anything else is not one */
        if (!((a[i] >= 'A' && a[i] <= 'Z') || (a[i] >= 'a' && a[i] <= 'z') ||
              (a[i] >= '0' && a[i] <= '9') || a[i] == '.'))
            return;
    memcpy(out, a, n);
    out[n] = '\0';
}

static const char *code_reason(const char *code, const char *fallback) {
    if (strcmp(code, "NoSuchBucket") == 0) return "no such bucket";
    if (strcmp(code, "NoSuchKey") == 0) return "no such key in the bucket";
    return fallback;
}

static int status_errno(long status) {
    return status == 401 || status == 403   ? -EACCES
           : status == 404 || status == 410 ? -ENOENT
                                            : -EIO;
}

static void log_once(remote_object *o, const char *msg) {
    if (!atomic_exchange(&o->logged, true)) fprintf(stderr, "ckptfs: %s\n", msg);
}

/* The object is no longer the version pinned: later reads fail, and its cached blocks go (once). */
static void note_changed_drop_cache(remote_object *o) {
    if (!atomic_exchange(&o->changed, true)) bc_forget(o->bc.id);
}

/* Whether an answer is of another version than the one pinned, and why: the pin is what the
 * server gave at open, the ETag, else the Last-Modified time, and the size always. An answer
 * that stops giving what was pinned (a server that dropped its ETag, a file server that never
 * sent one) cannot show it is the same version: it counts as another. NULL when the same. */
static const char *version_differs(const remote_object *o, const http_resp *rs) {
    if (rs->status == 412) return "precondition failed";
    if (rs->status == 206 && rs->has_range && rs->range_total != o->size) return "other size";
    if (rs->status == 200 && rs->has_length && rs->length != o->size) return "other size";
    if (o->etag[0]) {
        if (!rs->etag[0]) return "the server no longer sends its ETag";
        if (strcmp(rs->etag, o->etag) != 0) return "other ETag";
    } else if (o->mtime) {
        if (!rs->mtime) return "the server no longer sends its Last-Modified time";
        if (rs->mtime != o->mtime) return "other Last-Modified time";
    }
    return NULL;
}

/* A block of a pinned object: exactly the bytes asked for, of the version pinned. */
static int fetch_block(void *ctx, uint64_t k, void *buf, size_t len, char *msg, size_t cap) {
    remote_object *o = ctx;
    if (atomic_load(&o->changed)) {
        snprintf(msg, cap, "%s: the object changed since it was mounted", o->shown);
        return -EIO;
    }
    uint64_t start = block_start(o, k);
    http_req rq = {.url = o->target.url.data,
                   .shown = o->shown,
                   .auth = o->target.auth,
                   .hint = o->target.hint,
                   .ranged = true,
                   .off = start,
                   .len = len,
                   .buf = buf};
    http_resp rs;
    int rc = http_perform(&rq, &rs, msg, cap);
    const char *why_changed = NULL;
    if (rc == 0 && (rs.status == 200 || rs.status == 206 || rs.status == 412))
        why_changed = version_differs(o, &rs);
    if (rc == 0) {
        if (why_changed) {
            note_changed_drop_cache(o);
            snprintf(msg, cap, "%s: the object changed since it was mounted (%s)", o->shown,
                     why_changed);
            rc = -EIO;
        } else if (rs.status == 206) {
            if (!rs.has_range || rs.range_start != start || rs.range_end != start + len - 1)
                snprintf(msg, cap, "%s: asked for bytes %llu-%llu, the server answered %s%llu-%llu",
                         o->shown, (unsigned long long)start, (unsigned long long)(start + len - 1),
                         rs.has_range ? "Content-Range " : "without Content-Range ",
                         (unsigned long long)rs.range_start, (unsigned long long)rs.range_end),
                    rc = -EIO;
            else if (rs.overflow)
                /* The body went past the range asked: its last bytes were not what the range
                 * said (whether the extra came in the same chunk as the end or after it). */
                snprintf(msg, cap,
                         "%s: the server sent more than the %zu bytes asked at offset %llu",
                         o->shown, len, (unsigned long long)start),
                    rc = -EIO;
            else if (rs.got != len)
                snprintf(msg, cap, "%s: short body at offset %llu (%llu of %zu bytes)", o->shown,
                         (unsigned long long)start, (unsigned long long)rs.got, len),
                    rc = -EIO;
        } else if (rs.status == 200) {
            /* Only a whole object read from its start is an acceptable answer to a Range. */
            if (!(start == 0 && len == o->size && rs.got == len && !rs.overflow))
                snprintf(msg, cap,
                         "%s: the server ignored the Range request (200 instead of 206) at "
                         "offset %llu",
                         o->shown, (unsigned long long)start),
                    rc = -EIO;
        } else {
            snprintf(msg, cap, "%s: HTTP %ld %s", o->shown, rs.status, reason(rs.status));
            rc = status_errno(rs.status) == -EIO ? -EIO : -EIO;
        }
    }
    http_resp_free(&rs);
    if (rc) log_once(o, msg);
    return rc;
}

static void obj_hold(void *ctx) {
    atomic_fetch_add(&((remote_object *)ctx)->refs, 1);
}

static void obj_release(void *ctx) {
    remote_close(ctx);
}

void remote_close(remote_object *o) {
    if (!o || atomic_fetch_sub(&o->refs, 1) != 1) return;
    bc_forget(o->bc.id);
    remote_target_free(&o->target);
    pthread_mutex_destroy(&o->streams_lock);
    free(o->bounds);
    free(o->hard_bounds);
    free(o->shown);
    free(o);
}

remote_object *remote_hold(remote_object *o) {
    atomic_fetch_add(&o->refs, 1);
    return o;
}

/* ---- pinning ---- */

static int pin(const char *path, remote_object **out, ckpt_err *err) {
    *out = NULL;
    remote_object *o = calloc(1, sizeof *o);
    if (!o) return ckpt_fail(err, -ENOMEM, "out of memory");
    atomic_init(&o->refs, 1);
    pthread_mutex_init(&o->streams_lock, NULL);
    char shown[2048];
    remote_shown(path, shown, sizeof shown);
    o->shown = strdup(shown);
    int rc = o->shown ? remote_target_of(path, &o->target, err)
                      : ckpt_fail(err, -ENOMEM, "out of memory");
    if (rc) {
        free(o->shown);
        free(o);
        return rc;
    }
    o->block_len = conf.block_len;
    o->head_len = conf.block_len < HEAD_DEFAULT ? conf.block_len : HEAD_DEFAULT;
    char *head = malloc(o->head_len);
    if (!head) {
        remote_close(o);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    http_req rq = {.url = o->target.url.data,
                   .shown = o->shown,
                   .auth = o->target.auth,
                   .hint = o->target.hint,
                   .ranged = true,
                   .off = 0,
                   .len = o->head_len,
                   .buf = head};
    http_resp rs;
    char msg[512];
    rc = http_perform(&rq, &rs, msg, sizeof msg);
    if (rc) {
        rc = ckpt_fail(err, rc, "%s", msg);
    } else if (rs.status == 206 && rs.has_range && rs.range_start == 0 &&
               rs.range_end < rs.range_total && rs.got == rs.range_end + 1 &&
               rs.got == (rs.range_total < o->head_len ? rs.range_total : o->head_len)) {
        o->size = rs.range_total;
    } else if (rs.status == 206) {
        rc = ckpt_fail(err, -EIO,
                       "%s: asked for bytes 0-%llu, the server answered with %s%llu-%llu/%llu and "
                       "%llu bytes",
                       o->shown, (unsigned long long)(o->head_len - 1),
                       rs.has_range ? "Content-Range " : "no Content-Range ",
                       (unsigned long long)rs.range_start, (unsigned long long)rs.range_end,
                       (unsigned long long)rs.range_total, (unsigned long long)rs.got);
    } else if (rs.status == 200 && !rs.overflow && (!rs.has_length || rs.length == rs.got)) {
        o->size = rs.got; /* small enough to come whole */
    } else if (rs.status == 200) {
        rc = ckpt_fail(err, -EOPNOTSUPP,
                       "%s: the server does not answer Range requests (200 with the whole object "
                       "instead of 206); ckptfs needs byte ranges",
                       o->shown);
    } else if (rs.status == 416) {
        o->size = 0;
    } else {
        char code[64];
        error_code(head, rs.got < o->head_len ? rs.got : o->head_len, code, sizeof code);
        rc = ckpt_fail(err, status_errno(rs.status), "%s: HTTP %ld %s%s%s%s", o->shown, rs.status,
                       code_reason(code, reason(rs.status)), code[0] ? " (" : "", code,
                       code[0] ? ")" : "");
    }
    if (!rc) {
        snprintf(o->etag, sizeof o->etag, "%s", rs.etag);
        o->mtime = rs.mtime;
        o->bc = (bc_source){.id = atomic_fetch_add(&next_id, 1),
                            .fetch = fetch_block,
                            .ctx = o,
                            .hold = obj_hold,
                            .release = obj_release};
        /* The disk cache holds content: keyed by what names it and what versions it. */
        sha256_ctx c;
        uint8_t d[SHA256_DIGEST_LEN];
        char sz[32];
        sha256_init(&c);
        sha256_update(&c, o->shown, strlen(o->shown) + 1);
        sha256_update(&c, o->etag, strlen(o->etag) + 1);
        snprintf(sz, sizeof sz, "%llu/%llu/%llu", (unsigned long long)o->size,
                 (unsigned long long)o->head_len, (unsigned long long)o->block_len);
        sha256_update(&c, sz, strlen(sz));
        if (!o->etag[0]) {
            /* Without an ETag only the modification time tells versions apart. */
            snprintf(sz, sizeof sz, "%lld", (long long)o->mtime);
            sha256_update(&c, sz, strlen(sz));
        }
        sha256_final(&c, d);
        sha256_hex(d, o->disk_key);
        o->disk_key[32] = 0;
        o->bc.disk_key = o->etag[0] || o->mtime ? o->disk_key : NULL;
        size_t first = block_size_of(o, 0);
        if (first) bc_insert(&o->bc, 0, head, first);
    }
    http_resp_free(&rs);
    free(head);
    if (rc) {
        remote_close(o);
        return rc;
    }
    *out = o;
    return 0;
}

/* ---- objects opened ahead (remote_warm) ---- */

static pthread_mutex_t warm_lock = PTHREAD_MUTEX_INITIALIZER;
typedef struct warm_entry {
    char *path;
    remote_object *o;
    struct warm_entry *next;
} warm_entry;
static warm_entry *warm_list;

static remote_object *take_warm(const char *path) {
    pthread_mutex_lock(&warm_lock);
    remote_object *o = NULL;
    for (warm_entry **pp = &warm_list; *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->path, path) == 0) {
            warm_entry *w = *pp;
            *pp = w->next;
            o = w->o;
            free(w->path);
            free(w);
            break;
        }
    pthread_mutex_unlock(&warm_lock);
    return o;
}

int remote_open(const char *path, remote_object **out, ckpt_err *err) {
    remote_object *o = take_warm(path);
    if (o) {
        *out = o;
        return 0;
    }
    return pin(path, out, err);
}

typedef struct warm_run {
    const char *const *paths;
    size_t n;
    _Atomic size_t next;
} warm_run;

static void *warm_worker(void *arg) {
    warm_run *w = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&w->next, 1);
        if (i >= w->n) break;
        remote_object *o;
        ckpt_err e;
        /* A failure is left for remote_open to meet again and report in order. */
        if (pin(w->paths[i], &o, &e) != 0) continue;
        warm_entry *we = malloc(sizeof *we);
        char *p = strdup(w->paths[i]);
        if (!we || !p) {
            free(we);
            free(p);
            remote_close(o);
            continue;
        }
        we->path = p;
        we->o = o;
        pthread_mutex_lock(&warm_lock);
        we->next = warm_list;
        warm_list = we;
        pthread_mutex_unlock(&warm_lock);
    }
    return NULL;
}

void remote_warm(const char *const *paths, size_t n) {
    enum { WARM_THREADS = 64 }; /* one round trip for a 64-shard checkpoint */
    if (n < 2) return;
    warm_run w = {paths, n, 0};
    pthread_t t[WARM_THREADS];
    size_t nt = 0;
    for (; nt < WARM_THREADS && nt < n; nt++)
        if (pthread_create(&t[nt], NULL, warm_worker, &w) != 0) break;
    warm_worker(&w);
    for (size_t i = 0; i < nt; i++) pthread_join(t[i], NULL);
}

/* ---- reading ---- */

uint64_t remote_size(const remote_object *o) {
    return o->size;
}

bool remote_private(const remote_object *o) {
    /* A scheme that hides secrets in its names (http's user:password@ and ?query): the
     * request URL is then not the shown one. */
    const remote_scheme *sc = remote_scheme_of(o->shown);
    return http_auth_has_secret(o->target.auth) ||
           (sc && sc->shown && strcmp(o->target.url.data, o->shown) != 0);
}

time_t remote_mtime(const remote_object *o) {
    return o->mtime;
}

bool remote_changed(const remote_object *o) {
    return atomic_load(&o->changed);
}

/* The stream a read at off continues (its previous read ended within a block of off: FUSE
 * threads answer readahead slightly out of order), or a fresh one in the least recently used
 * slot. Returns the bytes read in a row, this read included; *ahead is where prefetch for it
 * stops because another stream, begun after this one, read the bytes from there on (they may
 * have left the cache since: fetching them again would be waste): that stream's start, or the
 * end of this read once it ran into that stream's bytes (the kernel's readahead past where a
 * reader stops does). A stream begun inside another's bytes (a second pass over a tensor) is
 * not held back by it. */
static uint64_t stream_began(const struct stream *s) {
    return s->next - (s->run < s->next ? s->run : s->next);
}

/* What a read tells of its stream (stream_advance). */
struct advance {
    uint64_t run, ahead, lowest;
    uint64_t passed_from, passed_to; /* blocks [from, to) it has moved past */
};

static void stream_advance(remote_object *o, uint64_t off, size_t len, struct advance *a) {
    pthread_mutex_lock(&o->streams_lock);
    uint64_t now = ++o->stream_clock;
    struct stream *hit = NULL, *old = &o->streams[0];
    for (size_t i = 0; i < STREAMS; i++) {
        struct stream *s = &o->streams[i];
        if (s->seen && off + o->block_len >= s->next && off <= s->next + o->block_len) {
            hit = s;
            break;
        }
        if (s->seen < old->seen) old = s;
    }
    if (!hit) {
        hit = old;
        hit->run = 0;
        hit->next = off;
        hit->lowest = off;
        hit->passed_next = 0;
    }
    if (off < hit->lowest) hit->lowest = off;
    a->lowest = hit->lowest;
    hit->run += len;
    if (off + len > hit->next) hit->next = off + len;
    hit->seen = now;
    a->run = hit->run;
    /* A sequential reader has moved past the blocks it read whole up to the one before the
     * block this read starts in (a block of slack: FUSE threads answer readahead slightly out
     * of order). Not block 0: it holds the header. */
    a->passed_from = a->passed_to = 0;
    uint64_t first_whole = block_of(o, hit->lowest);
    if (block_start(o, first_whole) < hit->lowest) first_whole++;
    uint64_t from = hit->passed_next > first_whole ? hit->passed_next : first_whole;
    if (from < 1) from = 1;
    uint64_t cur = block_of(o, off);
    if (a->run >= o->block_len && cur >= 2 && cur - 1 > from) {
        a->passed_from = from;
        a->passed_to = cur - 1;
        hit->passed_next = cur - 1;
    }
    uint64_t end = off + len, hit_began = stream_began(hit);
    a->ahead = UINT64_MAX;
    for (size_t i = 0; i < STREAMS; i++) {
        const struct stream *s = &o->streams[i];
        uint64_t began = stream_began(s);
        if (s == hit || !s->seen || began <= hit_began) continue;
        uint64_t stop = end <= began ? began : end < s->next ? end : UINT64_MAX;
        if (stop < a->ahead) a->ahead = stop;
    }
    pthread_mutex_unlock(&o->streams_lock);
}

static int by_offset(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The offsets (only the hard ones if only_hard) sorted, without duplicates, and without 0 and
 * those at or past the object's end: *out_n of them. */
static uint64_t *sorted_starts(const remote_object *o, const uint64_t *offsets, const bool *hard,
                               size_t n, bool only_hard, size_t *out_n) {
    uint64_t *b = n ? malloc(n * sizeof *b) : NULL;
    size_t k = 0;
    if (b) {
        for (size_t i = 0; i < n; i++)
            if (!only_hard || (hard && hard[i])) b[k++] = offsets[i];
        qsort(b, k, sizeof *b, by_offset);
        size_t m = 0;
        for (size_t i = 0; i < k; i++)
            if (b[i] > 0 && b[i] < o->size && (m == 0 || b[m - 1] != b[i])) b[m++] = b[i];
        k = m;
    }
    *out_n = k;
    return b;
}

void remote_set_boundaries(remote_object *o, const uint64_t *offsets, const bool *hard, size_t n) {
    size_t nb, nh;
    uint64_t *b = sorted_starts(o, offsets, hard, n, false, &nb);
    uint64_t *h = sorted_starts(o, offsets, hard, n, true, &nh);
    pthread_mutex_lock(&o->streams_lock);
    free(o->bounds);
    free(o->hard_bounds);
    o->bounds = b;
    o->nbounds = nb;
    o->hard_bounds = h;
    o->nhard = nh;
    pthread_mutex_unlock(&o->streams_lock);
}

/* How many of the n sorted offsets in b are at or before `at`. */
static size_t count_upto(const uint64_t *b, size_t n, uint64_t at) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (b[mid] <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Where prefetch for a stream that last read up to `at` stops: the first part start after
 * `at`, or, for a stream that has crossed a part start already (the last one at or before `at`
 * lies above `lowest`, the lowest offset the stream read: a reader of a whole shard, not of one
 * tensor), the first hard one. The object's size when there is none. */
static uint64_t prefetch_stop(remote_object *o, uint64_t at, uint64_t lowest) {
    pthread_mutex_lock(&o->streams_lock);
    size_t i = count_upto(o->bounds, o->nbounds, at);
    uint64_t r = i < o->nbounds ? o->bounds[i] : o->size;
    if (i > 0 && o->bounds[i - 1] > lowest) {
        size_t j = count_upto(o->hard_bounds, o->nhard, at);
        r = j < o->nhard ? o->hard_bounds[j] : o->size;
    }
    pthread_mutex_unlock(&o->streams_lock);
    return r;
}

/* A stream that has read a block's worth in a row gets the blocks after this read fetched
 * ahead, `prefetch` of them in flight. The window grows with the run (never more ahead than
 * was read in a row), and stops where another stream began and at the next tensor's start,
 * unless this stream has read across a tensor's start already (a shard read whole through the
 * Hugging Face view): then only a tar member's end stops it. */
static void maybe_prefetch(remote_object *o, uint64_t off, size_t len) {
    if (!conf.prefetch) return;
    struct advance a;
    stream_advance(o, off, len, &a);
    for (uint64_t k = a.passed_from; k < a.passed_to; k++) bc_passed(&o->bc, k);
    if (a.run < o->block_len) return;
    uint64_t last = block_of(o, off + len - 1);
    uint64_t window = a.run / o->block_len;
    if (window > conf.prefetch) window = conf.prefetch;
    uint64_t stop = prefetch_stop(o, off + len - 1, a.lowest);
    if (a.ahead < stop) stop = a.ahead;
    for (uint64_t i = 1; i <= window; i++) {
        uint64_t k = last + i;
        size_t bl = block_size_of(o, k);
        if (!bl || block_start(o, k) >= stop) break;
        bc_prefetch(&o->bc, k, bl);
    }
}

/* A read spanning several blocks (an index file read whole) fetches them at once, not one
 * after the other. */
static void fetch_span(remote_object *o, uint64_t off, size_t len) {
    uint64_t first = block_of(o, off), last = block_of(o, off + len - 1);
    for (uint64_t k = first + 1; k <= last; k++) bc_prefetch(&o->bc, k, block_size_of(o, k));
}

ssize_t remote_pread(remote_object *o, void *buf, size_t len, uint64_t off) {
    if (atomic_load(&o->changed)) {
        snprintf(last_error, sizeof last_error, "%s: the object changed since it was mounted",
                 o->shown);
        return -EIO;
    }
    if (off >= o->size) return 0;
    if (len > o->size - off) len = (size_t)(o->size - off);
    maybe_prefetch(o, off, len);
    if (len) fetch_span(o, off, len);
    size_t done = 0;
    while (done < len) {
        uint64_t at = off + done;
        uint64_t k = block_of(o, at);
        uint64_t bs = block_start(o, k);
        size_t bl = block_size_of(o, k);
        size_t in = (size_t)(at - bs);
        size_t n = bl - in < len - done ? bl - in : len - done;
        int rc = bc_read(&o->bc, k, bl, in, (char *)buf + done, n, last_error, sizeof last_error);
        /* Whatever went wrong remotely (timeout, refusal, other bytes), a reader sees EIO, as
         * for a failing disk; the message says more. */
        if (rc) return done ? (ssize_t)done : rc == -ENOMEM ? rc : -EIO;
        done += n;
    }
    atomic_fetch_add(&bytes_read, len);
    atomic_fetch_add(&reads, 1);
    return (ssize_t)len;
}

int remote_view(remote_object *o, uint64_t off, size_t len, ckpt_view *v) {
    if (atomic_load(&o->changed)) {
        snprintf(last_error, sizeof last_error, "%s: the object changed since it was mounted",
                 o->shown);
        return -EIO;
    }
    if (off > o->size || len > o->size - off) return 0;
    if (!len) return 1;
    if (block_of(o, off + len - 1) - block_of(o, off) + 1 > CKPT_VIEW_MAX - v->n) return 0;
    maybe_prefetch(o, off, len);
    fetch_span(o, off, len);
    size_t first = v->n, done = 0;
    while (done < len) {
        uint64_t at = off + done;
        uint64_t k = block_of(o, at);
        size_t bl = block_size_of(o, k);
        size_t in = (size_t)(at - block_start(o, k));
        size_t n = bl - in < len - done ? bl - in : len - done;
        const char *data;
        int rc = bc_pin(&o->bc, k, bl, &data, &v->hold[v->n], last_error, sizeof last_error);
        if (rc) {
            while (v->n > first) bc_unpin(v->hold[--v->n]);
            return rc == -ENOMEM ? rc : -EIO;
        }
        v->base[v->n] = data + in;
        v->len[v->n++] = n;
        done += n;
    }
    atomic_fetch_add(&bytes_read, len);
    atomic_fetch_add(&reads, 1);
    return 1;
}

void remote_unview(void *hold) {
    bc_unpin(hold);
}

void remote_stats_json(strbuf *sb) {
    http_stats h;
    bc_stats b;
    http_get_stats(&h);
    bc_get_stats(&b);
    sb_printf(sb,
              "\"requests\": %llu, \"retries\": %llu, \"failed_requests\": %llu, "
              "\"bytes_fetched\": %llu, \"bytes_read\": %llu, \"reads\": %llu, "
              "\"block_size\": %llu, \"prefetch\": %u, \"block_hits\": %llu, "
              "\"block_misses\": %llu, \"block_waits\": %llu, \"blocks_prefetched\": %llu, "
              "\"block_fetches\": %llu, \"disk_hits\": %llu, \"disk_writes\": %llu, "
              "\"ram_bytes\": %llu, \"ram_blocks\": %llu, \"ram_cap\": %llu",
              (unsigned long long)h.requests, (unsigned long long)h.retries,
              (unsigned long long)h.failures, (unsigned long long)h.bytes,
              (unsigned long long)atomic_load(&bytes_read), (unsigned long long)atomic_load(&reads),
              (unsigned long long)conf.block_len, conf.prefetch, (unsigned long long)b.hits,
              (unsigned long long)b.misses, (unsigned long long)b.waits,
              (unsigned long long)b.prefetches, (unsigned long long)b.block_fetches,
              (unsigned long long)b.disk_hits, (unsigned long long)b.disk_writes,
              (unsigned long long)b.ram_bytes, (unsigned long long)b.ram_blocks,
              (unsigned long long)b.ram_cap);
}

char *ckpt_remote_stats_json(size_t *len) {
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{");
    remote_stats_json(&sb);
    sb_puts(&sb, "}\n");
    return sb_take(&sb, len);
}
