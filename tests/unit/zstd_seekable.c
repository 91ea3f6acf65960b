/* The seekable zstd reader and writer (core/io/zstd_seekable.c): seek tables written by the writer
 * and by hand, every read checked against the bytes that were compressed, the frame cache
 * under threads and past its budget, frames too large for it (streamed), entries holding
 * several frames, decoding ahead of sequential readers (with random readers beside them, a
 * table freed while frames are decoded ahead, a fork), and seek tables and frames that lie. */
#include "tap.h"
#include "io/zstd_seekable.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

typedef struct buf {
    unsigned char *p;
    size_t len, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void put32(buf *b, uint32_t v) {
    unsigned char x[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    put(b, x, 4);
}

/* Content: a pattern compressible but not trivially so. */
static unsigned char *content(size_t n, unsigned seed) {
    unsigned char *p = malloc(n ? n : 1);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        if (i % 64 == 0) x = x * 1103515245u + 12345u;
        p[i] = (unsigned char)((x >> 16) % 13 + (i & 3));
    }
    return p;
}

/* A seekable file of data cut at `cuts` (ascending, inside data) by the library's writer. */
static buf write_seekable(const unsigned char *data, size_t n, const size_t *cuts, size_t ncuts) {
    buf b = {0};
    zst_writer *w = zst_writer_new();
    size_t at = 0;
    for (size_t i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : n;
        while (at < end) {
            size_t take = end - at < ZST_FRAME_MAX ? end - at : ZST_FRAME_MAX;
            const void *out;
            size_t len;
            const char *why;
            if (zst_writer_frame(w, data + at, take, &out, &len, &why)) abort();
            put(&b, out, len);
            at += take;
        }
    }
    const void *out;
    size_t len;
    const char *why;
    if (zst_writer_table(w, &out, &len, &why)) abort();
    put(&b, out, len);
    zst_writer_free(w);
    return b;
}

/* A file of the bytes, open; the caller closes it. */
static int file_of(const buf *b) {
    char path[] = "/tmp/ckpt-unit-zst-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) abort();
    unlink(path);
    if (write(fd, b->p, b->len) != (ssize_t)b->len) abort();
    return fd;
}

static int open_table(const buf *b, int *fd, zst_table **t, ckpt_err *err) {
    *fd = file_of(b);
    int rc = zst_table_open(*fd, "test.zst", b->len, t, err);
    if (rc) close(*fd);
    return rc;
}

static bool same_range(const zst_table *t, const unsigned char *want, size_t size, uint64_t off,
                       size_t len) {
    unsigned char *got = malloc(len ? len : 1);
    ssize_t r = zst_pread(t, got, len, off);
    size_t expect = off >= size ? 0 : (len < size - off ? len : size - off);
    bool good = r == (ssize_t)expect && memcmp(got, want + (off < size ? off : 0), expect) == 0;
    if (!good)
        printf("#   pread(%zu at %llu) = %zd: %s\n", len, (unsigned long long)off, r,
               r < 0 ? zst_last_error() : "bytes differ");
    free(got);
    return good;
}

/* ---- the writer's files ---- */

static void test_written(void) {
    size_t n = 3 * ZST_FRAME_MAX + 12345;
    unsigned char *data = content(n, 1);
    size_t cuts[] = {1, 2, 100, 300000, 300001};
    buf b = write_seekable(data, n, cuts, 5);
    int fd;
    zst_table *t;
    ckpt_err err;
    int rc = open_table(&b, &fd, &t, &err);
    ok(rc == 0, "the writer's file opens (%s)", rc ? err.msg : "ok");
    if (rc) return;
    is_u64(zst_content_size(t), n, "content size");
    is_u64(zst_file_size(t), b.len, "file size");
    is_u64(zst_frame_count(t), 8, "frames of 1, 1, 98, 299900 and 1 bytes, then 3 of <= 1 MiB");
    bool good = same_range(t, data, n, 0, n);
    good &= same_range(t, data, n, 0, 1) && same_range(t, data, n, 1, 1);
    good &= same_range(t, data, n, 99, 5) && same_range(t, data, n, 299999, 3);
    good &= same_range(t, data, n, n - 1, 10) && same_range(t, data, n, n, 10);
    good &= same_range(t, data, n, n + 5, 10);
    ok(good, "reads inside, across and past frames");
    good = true;
    unsigned x = 7;
    for (int i = 0; i < 500 && good; i++) {
        x = x * 1103515245u + 12345u;
        uint64_t off = x % n;
        x = x * 1103515245u + 12345u;
        good = same_range(t, data, n, off, x % 70000);
    }
    ok(good, "500 random reads");
    zst_table_free(t);
    close(fd);
    free(b.p);
    free(data);
}

/* ---- the cache from many threads, and past its budget ---- */

typedef struct job {
    const zst_table *t;
    const unsigned char *data;
    size_t n;
    unsigned seed;
    int bad;
} job;

static void *reader(void *arg) {
    job *j = arg;
    unsigned x = j->seed;
    unsigned char *got = malloc(200000);
    for (int i = 0; i < 400; i++) {
        x = x * 1103515245u + 12345u;
        uint64_t off = x % j->n;
        x = x * 1103515245u + 12345u;
        size_t len = x % 200000;
        if (len > j->n - off) len = j->n - off;
        if (zst_pread(j->t, got, len, off) != (ssize_t)len || memcmp(got, j->data + off, len) != 0)
            j->bad++;
    }
    free(got);
    return NULL;
}

static void test_threads(void) {
    size_t n = 40 * ZST_FRAME_MAX; /* more than the cache holds */
    unsigned char *data = content(n, 2);
    buf b = write_seekable(data, n, NULL, 0);
    int fd;
    zst_table *t;
    ckpt_err err;
    if (open_table(&b, &fd, &t, &err)) {
        ok(0, "40 MiB file opens: %s", err.msg);
        return;
    }
    pthread_t th[4];
    job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){t, data, n, (unsigned)i + 11, 0};
        pthread_create(&th[i], NULL, reader, &jobs[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += jobs[i].bad;
    }
    ok(bad == 0, "4 threads x 400 random reads over 40 frames (cache of 16): %d bad", bad);
    zst_table_free(t);
    close(fd);
    free(b.p);
    free(data);
}

/* ---- decoding ahead of sequential readers ---- */

/* A seekable file of n bytes in 64 KiB frames, as the writer's callers cut them. */
static buf write_small_frames(const unsigned char *data, size_t n) {
    size_t ncuts = n / ZST_FRAME_TARGET;
    size_t *cuts = malloc((ncuts + 1) * sizeof *cuts);
    for (size_t i = 0; i < ncuts; i++) cuts[i] = (i + 1) * ZST_FRAME_TARGET;
    if (ncuts && cuts[ncuts - 1] == n) ncuts--;
    buf b = write_seekable(data, n, cuts, ncuts);
    free(cuts);
    return b;
}

typedef struct stream_job {
    const zst_table *t;
    const unsigned char *data;
    size_t n, stop; /* read [0, stop) front to back */
    unsigned seed;
    int bad;
} stream_job;

static void *stream_reader(void *arg) {
    stream_job *j = arg;
    unsigned x = j->seed;
    unsigned char *got = malloc(1 << 20);
    for (size_t off = 0; off < j->stop;) {
        x = x * 1103515245u + 12345u;
        size_t len = (x >> 8) % 3 == 0 ? 4096 : (x >> 8) % 3 == 1 ? 128 << 10 : 1 << 20;
        if (len > j->stop - off) len = j->stop - off;
        if (zst_pread(j->t, got, len, off) != (ssize_t)len || memcmp(got, j->data + off, len))
            j->bad++;
        off += len;
    }
    free(got);
    return NULL;
}

/* Sequential readers make the workers decode ahead; random readers share the cache with them.
 * Every byte is compared; then a table is freed while its frames are being decoded ahead. */
static void test_read_ahead(void) {
    zst_read_ahead_allow();
    size_t n = 24 << 20; /* more than the cache holds */
    unsigned char *data = content(n, 5);
    buf b = write_small_frames(data, n);
    int fd[2];
    zst_table *t[2];
    ckpt_err err;
    if (open_table(&b, &fd[0], &t[0], &err) || open_table(&b, &fd[1], &t[1], &err)) {
        ok(0, "24 MiB file of 64 KiB frames opens: %s", err.msg);
        return;
    }
    ok(zst_frame_count(t[0]) == n / ZST_FRAME_TARGET, "%u frames of 64 KiB", zst_frame_count(t[0]));
    pthread_t th[5];
    stream_job sj[3];
    job rj[2];
    for (int i = 0; i < 3; i++) {
        sj[i] = (stream_job){t[i % 2], data, n, n, (unsigned)i + 3, 0};
        pthread_create(&th[i], NULL, stream_reader, &sj[i]);
    }
    for (int i = 0; i < 2; i++) {
        rj[i] = (job){t[i], data, n, (unsigned)i + 21, 0};
        pthread_create(&th[3 + i], NULL, reader, &rj[i]);
    }
    for (int i = 0; i < 5; i++) pthread_join(th[i], NULL);
    ok(sj[0].bad + sj[1].bad + sj[2].bad == 0,
       "3 sequential readers over 2 tables (reads of 4 KiB to 1 MiB): %d bad",
       sj[0].bad + sj[1].bad + sj[2].bad);
    ok(rj[0].bad + rj[1].bad == 0, "2 random readers beside them: %d bad", rj[0].bad + rj[1].bad);

    /* A stream stopped a quarter in leaves frames queued and being decoded: freeing the table
     * drops those and waits for these (ASan and valgrind see any use after the free). */
    stream_job half = {t[0], data, n, n / 4, 9, 0};
    stream_reader(&half);
    zst_table_free(t[0]);
    close(fd[0]);
    ok(half.bad == 0, "a stream a quarter in, then its table freed while decoding ahead");

    /* A child of fork has none of the parent's workers: its own sequential read must neither
     * hang waiting for them nor read wrong bytes. */
    stream_job again = {t[1], data, n, n / 2, 13, 0};
    stream_reader(&again);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        stream_job child = {t[1], data, n, n, 17, 0};
        stream_reader(&child);
        _exit(child.bad ? 1 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ok(again.bad == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "a forked child reads the table sequentially, with workers of its own (status %d)", status);
    zst_table_free(t[1]);
    close(fd[1]);
    free(b.p);
    free(data);
}

/* ---- seek tables written by hand ---- */

typedef struct entry {
    buf frame;
    uint32_t dsize;
} entry;

static buf zframe(const unsigned char *p, size_t n, int checksum) {
    ZSTD_CCtx *c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, checksum);
    buf b = {0};
    b.cap = ZSTD_compressBound(n);
    b.p = malloc(b.cap);
    b.len = ZSTD_compress2(c, b.p, b.cap, p, n);
    if (ZSTD_isError(b.len)) abort();
    ZSTD_freeCCtx(c);
    return b;
}

static buf table_file(const entry *e, size_t n, unsigned desc, uint32_t count) {
    buf b = {0};
    for (size_t i = 0; i < n; i++) put(&b, e[i].frame.p, e[i].frame.len);
    unsigned es = desc & 0x80 ? 12 : 8;
    put32(&b, 0x184D2A5E);
    put32(&b, (uint32_t)(n * es + 9));
    for (size_t i = 0; i < n; i++) {
        put32(&b, (uint32_t)e[i].frame.len);
        put32(&b, e[i].dsize);
        if (es == 12) put32(&b, 0);
    }
    put32(&b, count);
    unsigned char d = (unsigned char)desc;
    put(&b, &d, 1);
    put32(&b, 0x8F92EAB1);
    return b;
}

static void test_big_and_odd_frames(void) {
    /* entry 0: a skippable frame; 1: one frame of 6 MiB (streamed, not cached); 2: two zstd
     * frames and a skippable frame in one entry; 3: an empty frame. */
    size_t big = 6 << 20, a = 5000, c = 7000;
    unsigned char *data = content(big + a + c, 3);
    entry e[4] = {{{0}, 0}, {{0}, (uint32_t)big}, {{0}, (uint32_t)(a + c)}, {{0}, 0}};
    put32(&e[0].frame, 0x184D2A53);
    put32(&e[0].frame, 3);
    put(&e[0].frame, "abc", 3);
    e[1].frame = zframe(data, big, 1);
    buf f1 = zframe(data + big, a, 0), f2 = zframe(data + big + a, c, 1);
    put(&e[2].frame, f1.p, f1.len);
    put32(&e[2].frame, 0x184D2A50);
    put32(&e[2].frame, 0);
    put(&e[2].frame, f2.p, f2.len);
    e[3].frame = zframe(data, 0, 1);
    buf b = table_file(e, 4, 0x83, 4); /* checksums present, unused bits set */
    size_t n = big + a + c;
    int fd;
    zst_table *t;
    ckpt_err err;
    int rc = open_table(&b, &fd, &t, &err);
    ok(rc == 0, "skippable, 6 MiB, multi-frame and empty entries with checksums open (%s)",
       rc ? err.msg : "ok");
    if (!rc) {
        is_u64(zst_content_size(t), n, "content size");
        bool good = true;
        for (size_t off = 0; off < n && good; off += 65536)
            good = same_range(t, data, n, off, 65536);
        ok(good, "the 6 MiB frame read in order, 64 KiB at a time");
        good = same_range(t, data, n, big - 10, 20) && same_range(t, data, n, 3 << 20, 100);
        good &= same_range(t, data, n, 100, 100) && same_range(t, data, n, big + a - 3, 9);
        ok(good, "reads backwards into the large frame and across entries");
        pthread_t th[2];
        job jobs[2] = {{t, data, n, 5, 0}, {t, data, n, 6, 0}};
        for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, reader, &jobs[i]);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        ok(jobs[0].bad + jobs[1].bad == 0, "2 threads of random reads, mostly in the large frame");
        zst_table_free(t);
        close(fd);
    }
    free(b.p);

    /* The large frame says one byte more than it holds: found at its end. */
    e[1].dsize = (uint32_t)big + 1;
    b = table_file(e, 4, 0, 4);
    rc = open_table(&b, &fd, &t, &err);
    if (!rc) {
        unsigned char x[16];
        ok(zst_pread(t, x, 16, 0) == 16, "a large frame that lies about its size: its start reads");
        ssize_t r = zst_pread(t, x, 16, big - 8);
        ok(r == -EIO && strstr(zst_last_error(), "Decompressed_Size"),
           "... and reading to its end gives EIO: %s", zst_last_error());
        zst_table_free(t);
        close(fd);
    }
    free(b.p);
    e[1].dsize = (uint32_t)big - 1;
    b = table_file(e, 4, 0, 4);
    rc = open_table(&b, &fd, &t, &err);
    if (!rc) {
        unsigned char x[16];
        ssize_t r = zst_pread(t, x, 16, big - 16);
        ok(r == -EIO && strstr(zst_last_error(), "more than"),
           "a large frame holding one byte more than it says: EIO at its end: %s",
           zst_last_error());
        zst_table_free(t);
        close(fd);
    }
    free(b.p);
    for (int i = 0; i < 4; i++) free(e[i].frame.p);
    free(f1.p);
    free(f2.p);
    free(data);
}

/* ---- seek tables that lie ---- */

static void refused(const buf *b, int want_rc, const char *needle, const char *what) {
    int fd = file_of(b);
    zst_table *t = NULL;
    ckpt_err err = {{0}};
    int rc = zst_table_open(fd, "bad.zst", b->len, &t, &err);
    ok(rc == want_rc && !t && (!needle || strstr(err.msg, needle)), "%s: %s", what,
       rc > 0 ? "not seekable" : err.msg);
    zst_table_free(t);
    close(fd);
}

static void test_hostile(void) {
    unsigned char *data = content(30000, 4);
    entry e[3] = {{zframe(data, 10000, 1), 10000},
                  {zframe(data + 10000, 10000, 1), 10000},
                  {zframe(data + 20000, 10000, 1), 10000}};
    buf b = table_file(e, 3, 0, 3);
    size_t foot = b.len - 9;

    buf x = {0};
    put(&x, b.p, b.len - 1);
    refused(&x, 1, NULL, "no footer magic at the end");
    x.len = 0;
    put(&x, b.p, 10);
    refused(&x, 1, NULL, "10 bytes");
    free(x.p);

    buf y = table_file(e, 3, 0x04, 3);
    refused(&y, -EINVAL, "Seek_Table_Descriptor", "reserved bit 2");
    free(y.p);
    y = table_file(e, 3, 0, 0xFFFFFFFF);
    refused(&y, -EINVAL, "Number_Of_Frames", "2^32-1 frames");
    free(y.p);
    y = table_file(e, 3, 0, 4);
    refused(&y, -EINVAL, "Skippable_Magic_Number", "one frame too many");
    free(y.p);
    y = table_file(e, 3, 0, 3);
    y.p[foot + 4] = 0x80; /* 12-byte entries promised, 8-byte ones there */
    refused(&y, -EINVAL, NULL, "Checksum_Flag on 8-byte entries");
    free(y.p);

    y = table_file(e, 3, 0, 3);
    y.p[b.len - 9 - 24 - 4] ^= 1; /* Frame_Size */
    refused(&y, -EINVAL, "Frame_Size", "Frame_Size off by one");
    free(y.p);

    entry f[3] = {e[0], e[1], e[2]};
    buf z = table_file(f, 3, 0, 3);
    size_t c1 = z.len - 9 - 24 + 8; /* Compressed_Size of frame 1 */
    memset(z.p + c1, 0, 4);
    refused(&z, -EINVAL, "Compressed_Size 0", "a frame of no bytes with content");
    memset(z.p + c1, 0xFF, 4);
    refused(&z, -EINVAL, "Compressed_Size", "a 4 GiB frame");
    free(z.p);
    z = table_file(f, 3, 0, 3);
    z.p[c1] ^= 1;
    refused(&z, -EINVAL, "Compressed_Size", "sizes that do not add up");
    free(z.p);

    /* Frame data that lies, found when read. */
    f[0].dsize = 10001;
    f[1].dsize = 9999;
    z = table_file(f, 3, 0, 3);
    int fd;
    zst_table *t;
    ckpt_err err;
    if (!open_table(&z, &fd, &t, &err)) {
        unsigned char tmp[8];
        ok(zst_pread(t, tmp, 8, 0) == -EIO && strstr(zst_last_error(), "Decompressed_Size"),
           "a frame holding less than its entry: EIO (%s)", zst_last_error());
        ok(zst_pread(t, tmp, 8, 10001) == -EIO && strstr(zst_last_error(), "more than"),
           "a frame holding more than its entry: EIO (%s)", zst_last_error());
        ok(zst_pread(t, tmp, 8, 20000) == 8 && memcmp(tmp, data + 20000, 8) == 0,
           "the frame after them still reads");
        zst_table_free(t);
        close(fd);
    }
    free(z.p);
    f[0].dsize = f[1].dsize = 10000;
    z = table_file(f, 3, 0, 3);
    z.p[e[0].frame.len + e[1].frame.len / 2] ^= 0x55;
    if (!open_table(&z, &fd, &t, &err)) {
        unsigned char tmp[8];
        ok(zst_pread(t, tmp, 8, 10000) == -EIO && strstr(zst_last_error(), "frame 1"),
           "damaged frame data: EIO naming the frame (%s)", zst_last_error());
        zst_table_free(t);
        close(fd);
    }
    free(z.p);
    free(b.p);
    for (int i = 0; i < 3; i++) free(e[i].frame.p);
    free(data);
}

static void test_magic(void) {
    const unsigned char frame[] = {0x28, 0xB5, 0x2F, 0xFD}, skip[] = {0x5E, 0x2A, 0x4D, 0x18},
                        skip_f[] = {0x5F, 0x2A, 0x4D, 0x18}, other[] = {0x29, 0xB5, 0x2F, 0xFD};
    ok(zst_magic(frame, 4) && zst_magic(skip, 4) && zst_magic(skip_f, 4) && !zst_magic(other, 4) &&
           !zst_magic(frame, 3),
       "zst_magic: zstd and skippable frames, nothing else");
}

int main(void) {
    test_magic();
    test_written();
    test_threads();
    test_read_ahead();
    test_big_and_odd_frames();
    test_hostile();
    return tap_done();
}
