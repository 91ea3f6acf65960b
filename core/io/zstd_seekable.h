/* The zstd seekable format (zstd's contrib/seekable_format): ordinary zstd frames, compressed
 * independently, followed by a skippable frame (magic 0x184D2A5E) holding the seek table: per
 * frame a u32 Compressed_Size, a u32 Decompressed_Size and, when the descriptor's bit 7 is set, a
 * u32 checksum; then the 9-byte footer u32 Number_Of_Frames, u8 Seek_Table_Descriptor, u32
 * Seekable_Magic_Number 0x8F92EAB1. Little-endian throughout.
 *
 * Reading: a source whose bytes are such a file is shown decompressed; any byte range is read by
 * decompressing only the frames that hold it. Decompressed frames are kept in a small cache
 * shared by the whole process, so random small reads do not decompress one frame again and
 * again. Writing: frames are compressed one at a time (with zstd's own content checksum, which
 * libzstd verifies on every decompression) and the seek table is built at the end. */
#ifndef CKPT_ZSTD_SEEKABLE_H
#define CKPT_ZSTD_SEEKABLE_H

#include "../ckpt.h"

/* A frame holds at most ZST_FRAME_MAX decompressed bytes (files of earlier ckptfs versions hold
 * such frames); the writer fills ZST_FRAME_TARGET, and ends a frame at a tensor boundary once it
 * holds a quarter of that. Small frames make a random read decompress little: 64 KiB measured best
 * (random 4 KiB reads and sequential throughput both; see tests/bench/zstd_bench.py). */
enum { ZST_FRAME_MAX = 1 << 20, ZST_FRAME_TARGET = 64 << 10 };

typedef struct zst_table zst_table;

/* True when head (n bytes) starts with a zstd frame or a skippable frame. */
bool zst_magic(const unsigned char *head, size_t n);

/* Reads and checks the seek table at the end of the open file fd of file_size bytes. Returns 0
 * with *out set for a seekable file, 1 when the file has no seek table at its end (not seekable),
 * or a negative errno with a message naming path, the field and its offset. fd stays the
 * caller's and must stay open as long as the table is used. */
int zst_table_open(int fd, const char *path, uint64_t file_size, zst_table **out, ckpt_err *err);
/* The same over a remote object's bytes (core/remote). */
struct remote_object;
int zst_table_open_remote(struct remote_object *remote, const char *path, uint64_t file_size,
                          zst_table **out, ckpt_err *err);
/* Also drops the table's frames from the cache; no read may be running on it. */
void zst_table_free(zst_table *t);
uint64_t zst_content_size(const zst_table *t); /* decompressed bytes */
uint64_t zst_file_size(const zst_table *t);    /* compressed bytes on disk */
uint32_t zst_frame_count(const zst_table *t);

/* Up to len decompressed bytes at off into buf: the number of bytes (0 at or past the end), or
 * a negative errno (-EIO for damaged frame data, -ENOMEM). Safe to call from many threads. */
ssize_t zst_pread(const zst_table *t, void *buf, size_t len, uint64_t off);
/* Why the calling thread's last failed zst_pread failed: the file, the frame, its offset. */
const char *zst_last_error(void);
/* Lets the process decode the frames ahead of sequential readers on worker threads (one per
 * CPU). Off until called: a daemon calls it once it has forked, since threads do not survive
 * a fork (and a fork while they run is unsafe under some allocators). */
void zst_read_ahead_allow(void);

/* ---- writing ---- */

typedef struct zst_writer zst_writer;

zst_writer *zst_writer_new(void);
void zst_writer_free(zst_writer *w);
/* Compresses n (<= ZST_FRAME_MAX) bytes into one frame and records it in the seek table. *out
 * points at the frame's bytes until the next call. 0 or a negative errno (why says what). */
int zst_writer_frame(zst_writer *w, const void *src, size_t n, const void **out, size_t *out_len,
                     const char **why);
/* The seek-table frame for the frames so far; *out points at it until the next call. */
int zst_writer_table(zst_writer *w, const void **out, size_t *out_len, const char **why);

#endif
