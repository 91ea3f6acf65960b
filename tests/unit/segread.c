/* ckpt_read_segments against a segment-by-segment reference: random segment lists over two
 * files (interleaved row fragments as a dim-1 consolidation plans them, sparse strided ones,
 * memory parts, overlaps, segments past the window), with and without scratch memory. */
#include "../../core/model/catalog.h"
#include "../../core/read/segread.h"
#include "tap.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

enum { FILE_SIZE = 3 << 20, NSRC = 2 };

static unsigned char file_bytes[NSRC][FILE_SIZE];
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void reference(const ckpt_segment *seg, size_t n, unsigned char *out) {
    for (size_t i = 0; i < n; i++) {
        const unsigned char *from =
            seg[i].kind == CKPT_SEG_MEM ? seg[i].mem : file_bytes[seg[i].source] + seg[i].offset;
        memcpy(out, from, seg[i].length);
        out += seg[i].length;
    }
}

/* Row fragments of `ranks` shards split on dim 1: row r of rank k at k's file offset. */
static size_t interleaved(ckpt_segment *seg, size_t rows, size_t ranks, uint64_t frag) {
    size_t n = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t k = 0; k < ranks; k++)
            seg[n++] = (ckpt_segment){.kind = CKPT_SEG_FILE,
                                      .source = (uint32_t)(k % NSRC),
                                      .offset = (k / NSRC) * (FILE_SIZE / 2) + r * frag,
                                      .length = frag};
    return n;
}

static size_t random_list(ckpt_segment *seg, size_t cap, uint64_t *total) {
    static const unsigned char mem[4096] = {1, 2, 3, 4, 5};
    size_t n = 1 + next() % cap;
    *total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = 1 + next() % (next() % 8 == 0 ? (2u << 20) : 8192);
        if (next() % 10 == 0) {
            len = len % sizeof mem + 1;
            seg[i] = (ckpt_segment){.kind = CKPT_SEG_MEM, .mem = mem, .length = len};
        } else {
            uint64_t off = next() % (FILE_SIZE - len);
            if (i && next() % 2 && seg[i - 1].kind == CKPT_SEG_FILE) {
                /* just after (or a little after) the previous one: the dense case */
                uint64_t at = seg[i - 1].offset + seg[i - 1].length + next() % 64;
                if (at + len <= FILE_SIZE) off = at;
            }
            seg[i] = (ckpt_segment){.kind = CKPT_SEG_FILE,
                                    .source = (uint32_t)(next() % NSRC),
                                    .offset = off,
                                    .length = len};
        }
        *total += len;
    }
    return n;
}

int main(void) {
    char dir[] = "/tmp/ckpt-segread.XXXXXX";
    if (!mkdtemp(dir)) return 1;
    ckpt_catalog *cat = catalog_new(dir, "test");
    ckpt_err err;
    for (int s = 0; s < NSRC; s++) {
        for (size_t i = 0; i < FILE_SIZE; i++) file_bytes[s][i] = (unsigned char)(next() >> 24);
        char path[64];
        snprintf(path, sizeof path, "%s/f%d", dir, s);
        FILE *f = fopen(path, "wb");
        fwrite(file_bytes[s], 1, FILE_SIZE, f);
        fclose(f);
        uint32_t idx;
        ok(catalog_add_source(cat, path, path + strlen(dir) + 1, &idx, &err) == 0 &&
               idx == (uint32_t)s,
           "source %d opened", s);
    }
    char *scratch = malloc(SEGREAD_SCRATCH);
    unsigned char *got = malloc(64 << 20), *want = malloc(64 << 20);

    static ckpt_segment seg[1024];
    size_t n = interleaved(seg, 64, 4, 4096);
    reference(seg, n, want);
    ok(ckpt_read_segments(cat, seg, n, (char *)got, scratch) == 0 &&
           memcmp(got, want, n * 4096) == 0,
       "4 ranks x 64 rows of 4 KiB fragments, gathered");
    n = interleaved(seg, 200, 3, 100);
    reference(seg, n, want);
    ok(ckpt_read_segments(cat, seg, n, (char *)got, scratch) == 0 &&
           memcmp(got, want, n * 100) == 0,
       "3 ranks x 200 rows of 100-byte fragments (more than one window of segments)");

    int bad = 0;
    for (int round = 0; round < 400; round++) {
        uint64_t total;
        n = random_list(seg, round % 2 ? 1024 : 16, &total);
        if (total > (64u << 20)) continue;
        reference(seg, n, want);
        memset(got, 0xA5, total);
        int e1 = ckpt_read_segments(cat, seg, n, (char *)got, scratch);
        bool same1 = memcmp(got, want, total) == 0;
        memset(got, 0x5A, total);
        int e2 = ckpt_read_segments(cat, seg, n, (char *)got, NULL);
        bool same2 = memcmp(got, want, total) == 0;
        if (e1 || e2 || !same1 || !same2) {
            if (!bad)
                printf("# round %d: n=%zu e=%d/%d same=%d/%d\n", round, n, e1, e2, same1, same2);
            bad++;
        }
    }
    ok(bad == 0, "400 random segment lists read the same as one pread each (%d differ)", bad);

    seg[0] = (ckpt_segment){.kind = CKPT_SEG_FILE, .source = 0, .offset = 0, .length = 10};
    seg[1] = (ckpt_segment){.kind = CKPT_SEG_HOLE, .length = 10};
    ok(ckpt_read_segments(cat, seg, 2, (char *)got, scratch) == -EIO, "a hole is EIO");
    seg[1] =
        (ckpt_segment){.kind = CKPT_SEG_FILE, .source = 0, .offset = FILE_SIZE - 5, .length = 10};
    ok(ckpt_read_segments(cat, seg, 2, (char *)got, scratch) == -EIO &&
           ckpt_read_segments(cat, seg, 2, (char *)got, NULL) == -EIO,
       "a segment past the end of its file is EIO, gathered or not");

    free(scratch);
    free(got);
    free(want);
    ckpt_close(cat);
    for (int s = 0; s < NSRC; s++) {
        char path[64];
        snprintf(path, sizeof path, "%s/f%d", dir, s);
        unlink(path);
    }
    rmdir(dir);
    return tap_done();
}
