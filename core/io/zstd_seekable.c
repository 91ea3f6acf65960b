#include "zstd_seekable.h"
#include "../util/search.h"
#include "../util/le.h"
#include "remote/remote.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>
#include <zstd_errors.h>

#define FRAME_MAGIC 0xFD2FB528u
#define SKIPPABLE_MASK 0xFFFFFFF0u
#define SKIPPABLE_MAGIC 0x184D2A50u /* 0x184D2A50..0x184D2A5F */
#define SEEK_TABLE_MAGIC 0x184D2A5Eu
#define SEEKABLE_MAGIC 0x8F92EAB1u

enum {
    SKIP_HEADER = 8, /* Skippable_Magic_Number, Frame_Size */
    FOOTER_SIZE = 9, /* Number_Of_Frames, Seek_Table_Descriptor, Seekable_Magic_Number */
    CHECKSUM_FLAG = 0x80,
    RESERVED_BITS = 0x7C,
    TABLE_CHUNK = 64 * 12, /* seek-table entries are read this many bytes at a time */
    /* The reference implementation reads no more frames than this; neither does the writer
     * write more, so what it writes stays readable there. */
    WRITER_MAX_FRAMES = 0x8000000,
    LEVEL = 3, /* fast: convert and commit should run at disk speed */

    SLOT_MAX = 4 << 20,     /* frames up to this size are decompressed whole and cached */
    CACHE_BYTES = 16 << 20, /* all cached frames together, for the whole process */
    SLOTS = 256, /* room for 16 MiB of 64 KiB frames: the cache is bounded by bytes, not slots */
    CURSORS = 2, /* decompressors parked inside frames larger than SLOT_MAX */
    IN_MAX = 2 << 20,     /* compressed frames up to this size are decompressed in one call */
    IN_CHUNK = 128 << 10, /* larger ones are read this much at a time */
    SCRATCH = 128 << 10,  /* where bytes before the wanted range are decompressed and dropped */

    /* Decoding ahead: a table read SEQ_READS times in a row within SEQ_SLACK of where its last
     * read ended is a sequential stream; the frames up to AHEAD_BYTES past its end are queued
     * for up to WORKERS_MAX threads (one per core), in the cache and within its byte cap. */
    SEQS = 8,
    SEQ_READS = 2,
    SEQ_SLACK = 4 << 20,
    AHEAD_BYTES = 4 << 20,
    WORKERS_MAX = 4,
};

bool zst_magic(const unsigned char *head, size_t n) {
    if (n < 4) return false;
    uint32_t m = le32(head);
    return m == FRAME_MAGIC || (m & SKIPPABLE_MASK) == SKIPPABLE_MAGIC;
}

/* Exactly len bytes at off: 0, -EIO at the end of the file, or another negative errno. */
static int read_at(int fd, struct remote_object *remote, void *buf, size_t len, uint64_t off) {
    size_t got = 0;
    while (got < len) {
        ssize_t r = remote ? remote_pread(remote, (char *)buf + got, len - got, off + got)
                           : pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (remote && r < 0) return (int)r;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -errno;
        if (r == 0) return -EIO;
        got += (size_t)r;
    }
    return 0;
}

/* ---- the seek table ---- */

struct zst_table {
    int fd;
    struct remote_object *remote; /* compressed bytes behind a URL instead of fd */
    char *path;
    uint32_t nframes;
    uint64_t file_size;
    /* nframes + 1 offsets each: frame k is bytes [coff[k], coff[k+1]) of the file and
     * [doff[k], doff[k+1]) of the content. */
    uint64_t *coff, *doff;
};

uint64_t zst_content_size(const zst_table *t) {
    return t->doff[t->nframes];
}

uint64_t zst_file_size(const zst_table *t) {
    return t->file_size;
}

uint32_t zst_frame_count(const zst_table *t) {
    return t->nframes;
}

#define ULL(x) ((unsigned long long)(x))

/* Checks the entries of the seek table at entries_at and fills t's offsets. Compressed sizes
 * must tile the file up to the seek-table frame at table_at. */
static int read_entries(zst_table *t, uint64_t entries_at, unsigned esize, uint64_t table_at,
                        ckpt_err *err) {
    unsigned char buf[TABLE_CHUNK];
    size_t have = 0, at = 0;
    for (uint32_t k = 0; k < t->nframes; k++) {
        uint64_t eat = entries_at + (uint64_t)k * esize;
        if (at == have) {
            uint64_t left = (uint64_t)(t->nframes - k) * esize;
            have = left < sizeof buf ? (size_t)left : sizeof buf;
            at = 0;
            int rc = read_at(t->fd, t->remote, buf, have, eat);
            if (rc)
                return ckpt_fail(err, rc, "%s: reading the seek table entries at offset %llu: %s",
                                 t->path, ULL(eat), strerror(-rc));
        }
        uint32_t c = le32(buf + at), d = le32(buf + at + 4);
        at += esize;
        if (c == 0 && d != 0)
            return ckpt_fail(err, -EINVAL,
                             "%s: Compressed_Size 0 of frame %u at offset %llu, but its "
                             "Decompressed_Size is %u",
                             t->path, k, ULL(eat), d);
        if (c > table_at - t->coff[k])
            return ckpt_fail(err, -EINVAL,
                             "%s: Compressed_Size %u of frame %u at offset %llu runs past the "
                             "seek table at offset %llu (the frame starts at %llu)",
                             t->path, c, k, ULL(eat), ULL(table_at), ULL(t->coff[k]));
        if (d > (uint64_t)INT64_MAX - t->doff[k])
            return ckpt_fail(err, -EOVERFLOW,
                             "%s: Decompressed_Size %u of frame %u at offset %llu makes the "
                             "content larger than 2^63 bytes",
                             t->path, d, k, ULL(eat));
        t->coff[k + 1] = t->coff[k] + c;
        t->doff[k + 1] = t->doff[k] + d;
    }
    if (t->coff[t->nframes] != table_at)
        return ckpt_fail(err, -EINVAL,
                         "%s: the Compressed_Size fields of the %u frames (seek table entries at "
                         "offset %llu) add up to %llu bytes, but the seek table starts at offset "
                         "%llu",
                         t->path, t->nframes, ULL(entries_at), ULL(t->coff[t->nframes]),
                         ULL(table_at));
    return 0;
}

static int table_open(int fd, struct remote_object *remote, const char *path, uint64_t size,
                      zst_table **out, ckpt_err *err) {
    *out = NULL;
    if (size < SKIP_HEADER + FOOTER_SIZE) return 1;
    unsigned char foot[FOOTER_SIZE];
    uint64_t foot_at = size - FOOTER_SIZE;
    int rc = read_at(fd, remote, foot, sizeof foot, foot_at);
    if (rc)
        return ckpt_fail(err, rc, "%s: reading the last %d bytes at offset %llu: %s", path,
                         FOOTER_SIZE, ULL(foot_at), strerror(-rc));
    if (le32(foot + 5) != SEEKABLE_MAGIC) return 1;
    uint32_t n = le32(foot);
    unsigned desc = foot[4];
    if (desc & RESERVED_BITS)
        return ckpt_fail(err, -EINVAL,
                         "%s: Seek_Table_Descriptor 0x%02x at offset %llu has reserved bits set "
                         "(bits 6-2 must be 0)",
                         path, desc, ULL(foot_at + 4));
    unsigned esize = desc & CHECKSUM_FLAG ? 12 : 8;
    /* Every entry must lie in the file: this bounds what is allocated below. */
    uint64_t room = size - FOOTER_SIZE - SKIP_HEADER;
    if (n > room / esize)
        return ckpt_fail(err, -EINVAL,
                         "%s: Number_Of_Frames %u at offset %llu needs %llu bytes of %u-byte seek "
                         "table entries, more than the %llu bytes before the footer",
                         path, n, ULL(foot_at), ULL((uint64_t)n * esize), esize, ULL(room));
    uint64_t entries_len = (uint64_t)n * esize;
    uint64_t table_at = room - entries_len; /* the seek table's skippable frame */
    unsigned char head[SKIP_HEADER];
    if ((rc = read_at(fd, remote, head, sizeof head, table_at)))
        return ckpt_fail(err, rc, "%s: reading the seek table frame at offset %llu: %s", path,
                         ULL(table_at), strerror(-rc));
    if (le32(head) != SEEK_TABLE_MAGIC)
        return ckpt_fail(err, -EINVAL,
                         "%s: Skippable_Magic_Number 0x%08x at offset %llu is not 0x184D2A5E: "
                         "the seek table of Number_Of_Frames %u (at offset %llu) would start "
                         "there",
                         path, le32(head), ULL(table_at), n, ULL(foot_at));
    if (le32(head + 4) != entries_len + FOOTER_SIZE)
        return ckpt_fail(err, -EINVAL,
                         "%s: Frame_Size %u at offset %llu of the seek table is not %llu, the "
                         "size of a table of %u frames",
                         path, le32(head + 4), ULL(table_at + 4), ULL(entries_len + FOOTER_SIZE),
                         n);
    zst_table *t = calloc(1, sizeof *t);
    if (t) {
        t->fd = fd;
        t->remote = remote;
        t->nframes = n;
        t->file_size = size;
        t->path = strdup(path);
        t->coff = calloc((size_t)n + 1, sizeof *t->coff);
        t->doff = calloc((size_t)n + 1, sizeof *t->doff);
    }
    if (!t || !t->path || !t->coff || !t->doff) {
        zst_table_free(t);
        return ckpt_fail(err, -ENOMEM, "%s: out of memory for a seek table of %u frames", path, n);
    }
    if ((rc = read_entries(t, table_at + SKIP_HEADER, esize, table_at, err))) {
        zst_table_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int zst_table_open(int fd, const char *path, uint64_t size, zst_table **out, ckpt_err *err) {
    return table_open(fd, NULL, path, size, out, err);
}

int zst_table_open_remote(struct remote_object *remote, const char *path, uint64_t size,
                          zst_table **out, ckpt_err *err) {
    return table_open(-1, remote, path, size, out, err);
}

/* ---- why a read failed ---- */

static _Thread_local char last_error[400];

const char *zst_last_error(void) {
    return last_error[0] ? last_error : "no zstd error";
}

static int frame_fail(const zst_table *t, uint32_t k, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int frame_fail(const zst_table *t, uint32_t k, int code, const char *fmt, ...) {
    int n = snprintf(last_error, sizeof last_error, "zstd frame %u at file offset %llu: ", k,
                     ULL(t->coff[k]));
    if (n > 0 && (size_t)n < sizeof last_error) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* ---- streaming through one frame ---- */

/* A decompressor positioned inside frame entry k: the entry may hold several zstd frames and
 * skippable frames, decompressed one after the other. */
typedef struct stream {
    ZSTD_DCtx *d;
    unsigned char *in, *scratch; /* IN_CHUNK and SCRATCH bytes */
    size_t in_len, in_at;
    uint64_t in_pos;  /* compressed bytes of the entry read so far */
    uint64_t out_pos; /* decompressed bytes made so far */
    bool ended;       /* the last call finished a zstd frame */
} stream;

static int stream_ready(stream *s) {
    if (!s->d) s->d = ZSTD_createDCtx();
    if (!s->in) s->in = malloc(IN_CHUNK);
    if (!s->scratch) s->scratch = malloc(SCRATCH);
    return s->d && s->in && s->scratch ? 0 : -ENOMEM;
}

static void stream_free(stream *s) {
    ZSTD_freeDCtx(s->d);
    free(s->in);
    free(s->scratch);
    memset(s, 0, sizeof *s);
}

static void stream_reset(stream *s) {
    ZSTD_DCtx_reset(s->d, ZSTD_reset_session_only);
    s->in_len = s->in_at = 0;
    s->in_pos = s->out_pos = 0;
    s->ended = false;
}

static uint64_t frame_csize(const zst_table *t, uint32_t k) {
    return t->coff[k + 1] - t->coff[k];
}

static uint64_t frame_dsize(const zst_table *t, uint32_t k) {
    return t->doff[k + 1] - t->doff[k];
}

/* One step: more input when the last is used up and the entry has more, then one
 * decompression call into out (which also flushes what the decompressor still holds). */
static int stream_step(const zst_table *t, uint32_t k, stream *s, ZSTD_outBuffer *out) {
    uint64_t left = frame_csize(t, k) - s->in_pos;
    if (s->in_at == s->in_len && left) {
        size_t n = left < IN_CHUNK ? (size_t)left : IN_CHUNK;
        int rc = read_at(t->fd, t->remote, s->in, n, t->coff[k] + s->in_pos);
        if (rc) return frame_fail(t, k, -EIO, "reading it: %s", strerror(-rc));
        s->in_len = n;
        s->in_at = 0;
        s->in_pos += n;
    }
    ZSTD_inBuffer in = {s->in, s->in_len, s->in_at};
    size_t r = ZSTD_decompressStream(s->d, out, &in);
    if (ZSTD_isError(r)) return frame_fail(t, k, -EIO, "%s", ZSTD_getErrorName(r));
    if (in.pos == s->in_at && out->pos == 0) {
        if (s->out_pos < frame_dsize(t, k))
            return frame_fail(t, k, -EIO,
                              "its data ends after %llu bytes of content, but its "
                              "Decompressed_Size says %llu",
                              ULL(s->out_pos), ULL(frame_dsize(t, k)));
        return frame_fail(t, k, -EIO, "its data ends inside a zstd frame (truncated)");
    }
    s->in_at = in.pos;
    s->out_pos += out->pos;
    s->ended = r == 0;
    return 0;
}

/* Decompresses on until the entry's bytes [from, to) are in dst (s->out_pos <= from); those
 * before from are dropped. */
static int stream_advance(const zst_table *t, uint32_t k, stream *s, uint64_t from, uint64_t to,
                          unsigned char *dst) {
    while (s->out_pos < to) {
        ZSTD_outBuffer out;
        if (s->out_pos < from) {
            uint64_t skip = from - s->out_pos;
            out = (ZSTD_outBuffer){s->scratch, skip < SCRATCH ? (size_t)skip : SCRATCH, 0};
        } else {
            out = (ZSTD_outBuffer){dst + (s->out_pos - from), (size_t)(to - s->out_pos), 0};
        }
        int rc = stream_step(t, k, s, &out);
        if (rc) return rc;
    }
    return 0;
}

/* At the end of the entry's content: the rest of its compressed bytes must finish the last
 * zstd frame and make no more content. */
static int stream_finish(const zst_table *t, uint32_t k, stream *s) {
    while (!s->ended || s->in_at < s->in_len || s->in_pos < frame_csize(t, k)) {
        ZSTD_outBuffer out = {s->scratch, SCRATCH, 0};
        int rc = stream_step(t, k, s, &out);
        if (rc) return rc;
        if (out.pos)
            return frame_fail(t, k, -EIO,
                              "it holds more than the %llu bytes its Decompressed_Size says",
                              ULL(frame_dsize(t, k)));
    }
    return 0;
}

/* ---- per thread: a decompression context and a buffer for one compressed frame ---- */

typedef struct thread_ctx {
    stream s;
    unsigned char *whole;
    size_t whole_cap;
} thread_ctx;

static pthread_key_t thread_key;
static pthread_once_t thread_once = PTHREAD_ONCE_INIT;

static void thread_ctx_free(void *p) {
    thread_ctx *c = p;
    stream_free(&c->s);
    free(c->whole);
    free(c);
}

static void thread_key_make(void) {
    pthread_key_create(&thread_key, thread_ctx_free);
}

static thread_ctx *thread_ctx_get(void) {
    pthread_once(&thread_once, thread_key_make);
    thread_ctx *c = pthread_getspecific(thread_key);
    if (c) return c;
    if (!(c = calloc(1, sizeof *c))) return NULL;
    if (stream_ready(&c->s) || pthread_setspecific(thread_key, c)) {
        thread_ctx_free(c);
        return NULL;
    }
    return c;
}

static int out_of_memory(void) {
    snprintf(last_error, sizeof last_error, "out of memory");
    return -ENOMEM;
}

/* Entry k's whole content into dst (frame_dsize bytes), checked against the table. */
static int decompress_whole(const zst_table *t, uint32_t k, unsigned char *dst) {
    thread_ctx *c = thread_ctx_get();
    if (!c) return out_of_memory();
    uint64_t csize = frame_csize(t, k), dsize = frame_dsize(t, k);
    if (csize > IN_MAX) { /* foreign files: bounded reads, whatever the frame's size */
        stream_reset(&c->s);
        int rc = stream_advance(t, k, &c->s, 0, dsize, dst);
        return rc ? rc : stream_finish(t, k, &c->s);
    }
    if (c->whole_cap < csize) {
        unsigned char *p = realloc(c->whole, (size_t)csize);
        if (!p) return out_of_memory();
        c->whole = p;
        c->whole_cap = (size_t)csize;
    }
    int rc = read_at(t->fd, t->remote, c->whole, (size_t)csize, t->coff[k]);
    if (rc) return frame_fail(t, k, -EIO, "reading it: %s", strerror(-rc));
    size_t r = ZSTD_decompressDCtx(c->s.d, dst, (size_t)dsize, c->whole, (size_t)csize);
    if (ZSTD_isError(r))
        return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall
                   ? frame_fail(t, k, -EIO,
                                "it holds more than the %llu bytes its Decompressed_Size says",
                                ULL(dsize))
                   : frame_fail(t, k, -EIO, "%s", ZSTD_getErrorName(r));
    if (r != dsize)
        return frame_fail(t, k, -EIO, "it holds %zu bytes, but its Decompressed_Size says %llu", r,
                          ULL(dsize));
    return 0;
}

/* The entry holding content byte pos (< the content size): the last whose start is <= pos, so
 * empty entries are passed over. */
static uint32_t frame_of(const zst_table *t, uint64_t pos) {
    return (uint32_t)last_at_or_before(t->doff, t->nframes, pos);
}

/* ---- the cache of decompressed frames, shared by every table and thread ---- */

typedef enum { SLOT_EMPTY, SLOT_LOADING, SLOT_READY } slot_state;

typedef struct slot {
    const zst_table *t;
    uint32_t frame;
    slot_state state;
    /* LOADING and not taken yet: decoded ahead of a sequential reader by the next free worker,
     * or by the first reader that needs it sooner (who then takes it over). */
    bool queued;
    unsigned refs; /* readers copying out of it (and its loader): not to be evicted */
    uint64_t used; /* cache clock at the last use: the least recent unpinned slot goes first */
    unsigned char *data;
    size_t cap; /* bytes allocated, counted in cache.bytes */
} slot;

/* A decompressor left where the last read of a large frame stopped, so reading such a frame
 * from start to end decompresses it once, not once per read. */
typedef struct cursor {
    const zst_table *t; /* NULL: holds nothing */
    uint32_t frame;
    bool busy;
    uint64_t used;
    stream s;
} cursor;

/* Where a table is being read: reads that keep starting near where the last one ended make it
 * a sequential stream, whose next frames the workers decode ahead. */
typedef struct seq {
    const zst_table *t; /* NULL: free */
    uint64_t end;       /* content offset where the furthest read ended */
    uint32_t ahead_to;  /* frames below this were queued already */
    unsigned streak;    /* reads in a row near `end` */
    uint64_t used;
} seq;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t loaded; /* a slot left LOADING */
    pthread_cond_t work;   /* a slot was queued */
    slot slots[SLOTS];
    cursor cursors[CURSORS];
    seq seqs[SEQS];
    size_t bytes;
    uint64_t clock;
    unsigned workers; /* decode-ahead threads running in this process */
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER,
           .loaded = PTHREAD_COND_INITIALIZER,
           .work = PTHREAD_COND_INITIALIZER};

static void slot_clear(slot *s) {
    free(s->data);
    cache.bytes -= s->cap;
    *s = (slot){.state = SLOT_EMPTY};
}

static slot *slot_find(const zst_table *t, uint32_t k) {
    for (int i = 0; i < SLOTS; i++) {
        slot *s = &cache.slots[i];
        if (s->state != SLOT_EMPTY && s->t == t && s->frame == k) return s;
    }
    return NULL;
}

/* The least recently used slot no one is reading, other than `but`. */
static slot *slot_lru(const slot *but) {
    slot *v = NULL;
    for (int i = 0; i < SLOTS; i++) {
        slot *s = &cache.slots[i];
        if (s != but && s->state == SLOT_READY && !s->refs && (!v || s->used < v->used)) v = s;
    }
    return v;
}

/* A slot for frame k of need bytes, marked LOADING and pinned for the caller, with room
 * reserved (the buffer itself may still have to be allocated); NULL when every slot is in
 * use. Under cache.lock. */
static slot *slot_claim(const zst_table *t, uint32_t k, size_t need) {
    slot *v = NULL;
    for (int i = 0; i < SLOTS && !v; i++)
        if (cache.slots[i].state == SLOT_EMPTY) v = &cache.slots[i];
    if (!v && !(v = slot_lru(NULL))) return NULL;
    if (v->cap < need) slot_clear(v);
    while (!v->cap && cache.bytes + need > CACHE_BYTES) {
        slot *o = slot_lru(v);
        if (!o) {
            slot_clear(v);
            return NULL;
        }
        slot_clear(o);
    }
    if (!v->cap) {
        v->cap = need;
        cache.bytes += need;
    }
    v->t = t;
    v->frame = k;
    v->state = SLOT_LOADING;
    v->queued = false;
    v->refs = 1;
    v->used = ++cache.clock;
    return v;
}

/* Decompresses the frame of slot s (LOADING, pinned, taken by the caller) into it; then it is
 * READY, or cleared on failure. Called without cache.lock; returns with it held. */
static int slot_load(slot *s) {
    if (!s->data) s->data = malloc(s->cap);
    int rc = s->data ? decompress_whole(s->t, s->frame, s->data) : out_of_memory();
    pthread_mutex_lock(&cache.lock);
    s->refs--;
    if (rc)
        slot_clear(s);
    else
        s->state = SLOT_READY;
    pthread_cond_broadcast(&cache.loaded);
    return rc;
}

/* ---- decoding ahead of sequential readers ---- */

/* The queued slot that waited longest; under cache.lock. */
static slot *next_queued(void) {
    slot *v = NULL;
    for (int i = 0; i < SLOTS; i++) {
        slot *s = &cache.slots[i];
        if (s->queued && (!v || s->used < v->used)) v = s;
    }
    return v;
}

static void *worker_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&cache.lock);
    for (;;) {
        slot *s = next_queued();
        if (!s) {
            pthread_cond_wait(&cache.work, &cache.lock);
            continue;
        }
        s->queued = false;
        pthread_mutex_unlock(&cache.lock);
        slot_load(s); /* a failure is met again, and reported, by the reader who needs it */
    }
    return NULL;
}

static bool ahead_allowed; /* zst_read_ahead_allow was called: workers may be started */

void zst_read_ahead_allow(void) {
    pthread_mutex_lock(&cache.lock);
    ahead_allowed = true;
    pthread_mutex_unlock(&cache.lock);
}

/* Workers are started on the first sequential stream once allowed, never before: a daemon
 * forks after opening its catalog, and threads do not survive a fork. Under cache.lock. */
static void workers_start(void) {
    if (cache.workers) return;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned want = cpus < 1 ? 1 : cpus > WORKERS_MAX ? WORKERS_MAX : (unsigned)cpus;
    sigset_t all, old;
    sigfillset(&all);
    /* Signals stay with the threads that expect them (the FUSE loop's exit handlers). */
    pthread_sigmask(SIG_BLOCK, &all, &old);
    for (unsigned i = 0; i < want; i++) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &at, worker_main, NULL) == 0) cache.workers++;
        pthread_attr_destroy(&at);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* In a child of fork only the forking thread lives on: no worker, no loader, no reader. */
static void after_fork_child(void) {
    pthread_mutex_init(&cache.lock, NULL);
    pthread_cond_init(&cache.loaded, NULL);
    pthread_cond_init(&cache.work, NULL);
    cache.workers = 0;
    for (int i = 0; i < SLOTS; i++) {
        slot *s = &cache.slots[i];
        if (s->state == SLOT_LOADING) slot_clear(s);
        s->refs = 0;
    }
    for (int i = 0; i < CURSORS; i++)
        if (cache.cursors[i].busy) cache.cursors[i] = (cursor){0};
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_handler_add(void) {
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* Notes a read of content [off, end) of t; when it continues a sequential stream, queues the
 * frames that follow it, up to AHEAD_BYTES past end and within the cache's byte cap. */
static void read_ahead(const zst_table *t, uint64_t off, uint64_t end) {
    pthread_once(&fork_once, fork_handler_add);
    pthread_mutex_lock(&cache.lock);
    seq *q = NULL;
    for (int i = 0; i < SEQS && !q; i++)
        if (cache.seqs[i].t == t) q = &cache.seqs[i];
    if (!q) {
        for (int i = 0; i < SEQS; i++)
            if (!q || cache.seqs[i].used < q->used) q = &cache.seqs[i];
        *q = (seq){.t = t, .end = end};
    } else if (off + SEQ_SLACK >= q->end && off <= q->end + SEQ_SLACK) {
        q->streak++; /* concurrent readahead READs may come a little out of order */
    } else {
        q->streak = 0;
        q->ahead_to = 0;
    }
    q->used = ++cache.clock;
    if (end > q->end) q->end = end;
    if (q->streak < SEQ_READS || !ahead_allowed) {
        pthread_mutex_unlock(&cache.lock);
        return;
    }
    uint32_t k = frame_of(t, q->end - 1) + 1;
    if (k < q->ahead_to) k = q->ahead_to;
    bool queued = false;
    for (; k < t->nframes && t->doff[k] < q->end + AHEAD_BYTES; k++) {
        uint64_t dsize = frame_dsize(t, k);
        if (!dsize || dsize > SLOT_MAX || slot_find(t, k)) continue;
        slot *s = slot_claim(t, k, (size_t)dsize);
        if (!s) break; /* the cache is full of frames being read: no room ahead */
        s->queued = queued = true;
    }
    q->ahead_to = k;
    if (queued) {
        workers_start();
        pthread_cond_broadcast(&cache.work);
    }
    pthread_mutex_unlock(&cache.lock);
}

/* Bytes [from, from+len) of entry k (at most SLOT_MAX bytes), through the cache. A read of a
 * whole frame that is not there decompresses it straight into the caller's buffer: a
 * sequential reader gains nothing from the cache, and the copy out of it would cost as much
 * as a tenth of the decompression. */
static int read_cached(const zst_table *t, uint32_t k, uint64_t from, unsigned char *dst,
                       size_t len) {
    size_t dsize = (size_t)frame_dsize(t, k);
    pthread_mutex_lock(&cache.lock);
    slot *s;
    /* Another thread decompressing this frame: wait for it rather than do it twice. One only
     * queued is taken over instead: no worker has started on it. */
    while ((s = slot_find(t, k)) && s->state == SLOT_LOADING && !s->queued)
        pthread_cond_wait(&cache.loaded, &cache.lock);
    if (s && s->state == SLOT_READY) {
        s->refs++;
        s->used = ++cache.clock;
        pthread_mutex_unlock(&cache.lock);
        memcpy(dst, s->data + from, len);
        pthread_mutex_lock(&cache.lock);
        s->refs--;
        pthread_mutex_unlock(&cache.lock);
        return 0;
    }
    if (s && len == dsize) { /* queued, and wanted whole: into the reply, as below */
        slot_clear(s);
        s = NULL;
    }
    if (s) {
        s->queued = false; /* this thread decodes it; its pin is now this thread's */
    } else if (len == dsize) {
        pthread_mutex_unlock(&cache.lock);
        return decompress_whole(t, k, dst);
    } else {
        s = slot_claim(t, k, dsize);
    }
    pthread_mutex_unlock(&cache.lock);
    if (!s) { /* every slot is being read: decompress privately */
        unsigned char *tmp = malloc(dsize);
        if (!tmp) return out_of_memory();
        int rc = decompress_whole(t, k, tmp);
        if (!rc) memcpy(dst, tmp + from, len);
        free(tmp);
        return rc;
    }
    s->refs++; /* still pinned for the copy below once slot_load dropped the loader's pin */
    int rc = slot_load(s);
    pthread_mutex_unlock(&cache.lock);
    if (!rc) memcpy(dst, s->data + from, len);
    pthread_mutex_lock(&cache.lock);
    if (!rc) s->refs--;
    pthread_mutex_unlock(&cache.lock);
    return rc;
}

/* Bytes [from, from+len) of a frame too large to cache, with a parked cursor that ends at or
 * before `from` when there is one. */
static int read_streamed(const zst_table *t, uint32_t k, uint64_t from, unsigned char *dst,
                         size_t len) {
    uint64_t to = from + len;
    pthread_mutex_lock(&cache.lock);
    cursor *c = NULL;
    for (int i = 0; i < CURSORS; i++) {
        cursor *x = &cache.cursors[i];
        if (!x->busy && x->t == t && x->frame == k && x->s.out_pos <= from &&
            (!c || x->s.out_pos > c->s.out_pos))
            c = x;
    }
    bool fresh = !c;
    for (int i = 0; i < CURSORS && fresh; i++) {
        cursor *x = &cache.cursors[i];
        if (!x->busy && (!c || x->used < c->used)) c = x;
    }
    if (c) {
        c->busy = true;
        c->t = t;
        c->frame = k;
    }
    pthread_mutex_unlock(&cache.lock);
    stream *s = NULL;
    thread_ctx *tc = NULL;
    if (c)
        s = &c->s;
    else if ((tc = thread_ctx_get())) /* every cursor is busy: this thread's own */
        s = &tc->s;
    int rc = s && !stream_ready(s) ? 0 : out_of_memory();
    if (!rc && fresh) stream_reset(s);
    if (!rc) rc = stream_advance(t, k, s, from, to, dst);
    if (!rc && to == frame_dsize(t, k)) rc = stream_finish(t, k, s);
    if (c) {
        pthread_mutex_lock(&cache.lock);
        c->busy = false;
        c->used = ++cache.clock;
        if (rc) c->t = NULL;
        pthread_mutex_unlock(&cache.lock);
    }
    return rc;
}

ssize_t zst_pread(const zst_table *t, void *buf, size_t len, uint64_t off) {
    uint64_t size = zst_content_size(t);
    if (off >= size) return 0;
    if (len > size - off) len = (size_t)(size - off);
    if (len > SSIZE_MAX) len = SSIZE_MAX;
    read_ahead(t, off, off + len);
    size_t got = 0;
    while (got < len) {
        uint64_t pos = off + got;
        uint32_t k = frame_of(t, pos);
        uint64_t from = pos - t->doff[k], dsize = frame_dsize(t, k);
        size_t take = len - got < dsize - from ? len - got : (size_t)(dsize - from);
        unsigned char *dst = (unsigned char *)buf + got;
        int rc = dsize > SLOT_MAX ? read_streamed(t, k, from, dst, take)
                                  : read_cached(t, k, from, dst, take);
        if (rc) return rc;
        got += take;
    }
    return (ssize_t)got;
}

void zst_table_free(zst_table *t) {
    if (!t) return;
    pthread_mutex_lock(&cache.lock);
    /* No reader runs on t, but workers may: drop what they have not started, wait for the
     * rest (they read t's file). */
    for (int i = 0; i < SLOTS; i++)
        if (cache.slots[i].queued && cache.slots[i].t == t) slot_clear(&cache.slots[i]);
    for (;;) {
        bool busy = false;
        for (int i = 0; i < SLOTS && !busy; i++)
            busy = cache.slots[i].state == SLOT_LOADING && cache.slots[i].t == t;
        if (!busy) break;
        pthread_cond_wait(&cache.loaded, &cache.lock);
    }
    for (int i = 0; i < SEQS; i++)
        if (cache.seqs[i].t == t) cache.seqs[i] = (seq){0};
    for (int i = 0; i < SLOTS; i++)
        if (cache.slots[i].state != SLOT_EMPTY && cache.slots[i].t == t)
            slot_clear(&cache.slots[i]);
    for (int i = 0; i < CURSORS; i++)
        if (cache.cursors[i].t == t) cache.cursors[i].t = NULL;
    pthread_mutex_unlock(&cache.lock);
    free(t->path);
    free(t->coff);
    free(t->doff);
    free(t);
}

/* ---- writing ---- */

struct zst_writer {
    ZSTD_CCtx *c;
    unsigned char *out; /* one compressed frame, or the seek table */
    size_t out_cap;
    uint32_t *sizes; /* per frame: compressed, decompressed */
    size_t n, cap;
};

zst_writer *zst_writer_new(void) {
    zst_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->c = ZSTD_createCCtx();
    w->out_cap = ZSTD_compressBound(ZST_FRAME_MAX);
    w->out = malloc(w->out_cap);
    /* Each frame carries its content's checksum, which libzstd checks whenever the frame is
     * decompressed; its content size in the header lets readers size their buffers. */
    if (!w->c || !w->out ||
        ZSTD_isError(ZSTD_CCtx_setParameter(w->c, ZSTD_c_compressionLevel, LEVEL)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(w->c, ZSTD_c_checksumFlag, 1)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(w->c, ZSTD_c_contentSizeFlag, 1))) {
        zst_writer_free(w);
        return NULL;
    }
    return w;
}

void zst_writer_free(zst_writer *w) {
    if (!w) return;
    ZSTD_freeCCtx(w->c);
    free(w->out);
    free(w->sizes);
    free(w);
}

int zst_writer_frame(zst_writer *w, const void *src, size_t n, const void **out, size_t *out_len,
                     const char **why) {
    if (n > ZST_FRAME_MAX) {
        *why = "a frame larger than 1 MiB";
        return -EINVAL;
    }
    if (w->n >= WRITER_MAX_FRAMES) {
        *why = "more frames than a seek table may list (2^27)";
        return -EFBIG;
    }
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        uint32_t *p = realloc(w->sizes, cap * 2 * sizeof *p);
        if (!p) {
            *why = "out of memory";
            return -ENOMEM;
        }
        w->sizes = p;
        w->cap = cap;
    }
    size_t r = ZSTD_compress2(w->c, w->out, w->out_cap, src, n);
    if (ZSTD_isError(r)) {
        *why = ZSTD_getErrorName(r);
        return -EIO;
    }
    w->sizes[2 * w->n] = (uint32_t)r;
    w->sizes[2 * w->n + 1] = (uint32_t)n;
    w->n++;
    *out = w->out;
    *out_len = r;
    return 0;
}

int zst_writer_table(zst_writer *w, const void **out, size_t *out_len, const char **why) {
    size_t len = SKIP_HEADER + w->n * 8 + FOOTER_SIZE;
    if (len > w->out_cap) {
        unsigned char *p = realloc(w->out, len);
        if (!p) {
            *why = "out of memory";
            return -ENOMEM;
        }
        w->out = p;
        w->out_cap = len;
    }
    unsigned char *p = w->out;
    put_le32(p, SEEK_TABLE_MAGIC);
    put_le32(p + 4, (uint32_t)(len - SKIP_HEADER));
    p += SKIP_HEADER;
    for (size_t i = 0; i < w->n; i++, p += 8) {
        put_le32(p, w->sizes[2 * i]);
        put_le32(p + 4, w->sizes[2 * i + 1]);
    }
    put_le32(p, (uint32_t)w->n);
    p[4] = 0; /* Seek_Table_Descriptor: no checksums in the table, the frames carry their own */
    put_le32(p + 5, SEEKABLE_MAGIC);
    *out = w->out;
    *out_len = len;
    return 0;
}
