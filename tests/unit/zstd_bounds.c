/* The seekable zstd writer's and reader's bounds: a frame of exactly ZST_FRAME_MAX bytes is
 * written (and read back byte for byte), one byte more is refused; reads that end exactly at the
 * end of the content, one byte before it and past it, and reads starting at and past the end. */
#include "tap.h"
#include "io/zstd_seekable.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned char *pattern(size_t n) {
    unsigned char *p = malloc(n);
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (unsigned char)(x >> 24 & 0x3f);
    }
    return p;
}

int main(void) {
    size_t n = ZST_FRAME_MAX, tail = 1000;
    unsigned char *data = pattern(n + 1);
    zst_writer *w = zst_writer_new();
    const void *out = NULL;
    size_t out_len = 0;
    const char *why = "";
    char path[] = "/tmp/ckptfs-zstd-bounds-XXXXXX";
    int fd = mkstemp(path);
    ok(w && fd >= 0, "a writer and a temporary file");
    if (!w || fd < 0) return tap_done();
    unlink(path);

    int rc = zst_writer_frame(w, data, n + 1, &out, &out_len, &why);
    ok(rc == -EINVAL, "a frame of ZST_FRAME_MAX + 1 bytes is refused (%s)", why);
    rc = zst_writer_frame(w, data, n, &out, &out_len, &why);
    ok(rc == 0 && write(fd, out, out_len) == (ssize_t)out_len, "a frame of ZST_FRAME_MAX bytes");
    rc = zst_writer_frame(w, data, tail, &out, &out_len, &why);
    ok(rc == 0 && write(fd, out, out_len) == (ssize_t)out_len, "a second frame of %zu bytes", tail);
    rc = zst_writer_table(w, &out, &out_len, &why);
    ok(rc == 0 && write(fd, out, out_len) == (ssize_t)out_len, "the seek table");
    off_t size = lseek(fd, 0, SEEK_END);

    zst_table *t = NULL;
    ckpt_err err = {{0}};
    rc = zst_table_open(fd, path, (uint64_t)size, &t, &err);
    ok(rc == 0 && t, "the file opens (%s)", err.msg);
    if (rc || !t) return tap_done();
    uint64_t total = n + tail;
    is_u64(zst_content_size(t), total, "content size: both frames");
    is_u64(zst_frame_count(t), 2, "two frames");

    unsigned char *got = malloc(total + 16);
    ssize_t r = zst_pread(t, got, total, 0);
    ok(r == (ssize_t)total && memcmp(got, data, n) == 0 && memcmp(got + n, data, tail) == 0,
       "the whole content, byte for byte (the 1 MiB frame included)");
    r = zst_pread(t, got, 16, total - 16);
    ok(r == 16 && memcmp(got, data + tail - 16, 16) == 0, "16 bytes ending exactly at the end");
    r = zst_pread(t, got, 16, total - 15);
    ok(r == 15 && memcmp(got, data + tail - 15, 15) == 0,
       "16 bytes from 15 before the end: 15 bytes");
    r = zst_pread(t, got, 2, n - 1);
    ok(r == 2 && got[0] == data[n - 1] && got[1] == data[0],
       "2 bytes across the frame boundary (the first frame's last byte, the second's first)");
    r = zst_pread(t, got, 16, total);
    ok(r == 0, "a read at the end: 0 bytes");
    r = zst_pread(t, got, 16, total + 1);
    ok(r == 0, "a read one byte past the end: 0 bytes");
    free(got);
    zst_table_free(t);
    zst_writer_free(w);
    close(fd);
    free(data);
    return tap_done();
}
