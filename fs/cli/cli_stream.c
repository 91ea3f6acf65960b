/* A tensor's logical bytes without a mount: the planner turns a byte range into file segments
 * and each is pread into the caller's buffer, the same path a FUSE read takes. */
#include "cli_internal.h"

#include "core/read/segread.h"

#include <errno.h>
#include <string.h>

enum { SEGMENTS = 256 };

static void tensor_label(const ckpt_tensor *t, char *out, size_t cap) {
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "tensor \"");
    text_pct_escape(&sb, t->name, t->name_len > 200 ? 200 : t->name_len, false);
    sb_putc(&sb, '"');
    snprintf(out, cap, "%s", sb.data && !sb.failed ? sb.data : "tensor");
    sb_free(&sb);
}

bool cli_find_hole(const ckpt_tensor *t, uint64_t off, uint64_t len, uint64_t *hole_off,
                   uint64_t *hole_len) {
    if (off >= t->nbytes) return false;
    if (len > t->nbytes - off) len = t->nbytes - off;
    ckpt_segment seg[SEGMENTS];
    uint64_t pos = off, end = off + len;
    while (pos < end) {
        uint64_t done;
        size_t n = ckpt_plan(t, pos, end - pos, seg, SEGMENTS, &done);
        if (n == 0 || done == 0) break;
        uint64_t at = pos;
        for (size_t i = 0; i < n; i++) {
            if (seg[i].kind == CKPT_SEG_HOLE) {
                *hole_off = at;
                *hole_len = seg[i].length;
                return true;
            }
            at += seg[i].length;
        }
        pos += done;
    }
    return false;
}

int cli_stream_tensor(const ckpt_catalog *cat, const ckpt_tensor *t, uint64_t off, uint64_t len,
                      void *buf, size_t bufsize, cli_sink sink, void *ctx, ckpt_err *err) {
    if (off > t->nbytes) off = t->nbytes;
    if (len > t->nbytes - off) len = t->nbytes - off;
    char what[300];
    tensor_label(t, what, sizeof what);
    ckpt_segment seg[SEGMENTS];
    uint64_t pos = off, end = off + len;
    while (pos < end) {
        uint64_t want = end - pos < bufsize ? end - pos : bufsize, done;
        size_t n = ckpt_plan(t, pos, want, seg, SEGMENTS, &done);
        if (n == 0 || done == 0) {
            ckpt_fail(err, -EIO, "%s: no bytes planned at offset %llu: %s", what,
                      (unsigned long long)pos, strerror(EIO));
            return CLI_SOURCE;
        }
        size_t fill = 0;
        for (size_t i = 0; i < n; i++) {
            const ckpt_segment *s = &seg[i];
            if (s->kind == CKPT_SEG_HOLE) {
                ckpt_fail(err, -EIO,
                          "%s: bytes %llu..%llu are in no file of the checkpoint (the tensor is "
                          "incomplete): %s",
                          what, (unsigned long long)(pos + fill),
                          (unsigned long long)(pos + fill + s->length - 1), strerror(EIO));
                return CLI_SOURCE;
            }
            if (s->kind == CKPT_SEG_MEM) {
                memcpy((char *)buf + fill, s->mem, s->length);
            } else if (s->kind == CKPT_SEG_STRIDED) {
                int e = ckpt_read_segments(cat, s, 1, (char *)buf + fill, NULL);
                if (e) {
                    ckpt_fail(err, e, "%s: reading its strided piece from %s: %s", what,
                              cat->sources[s->source].path, strerror(-e));
                    return CLI_SOURCE;
                }
            } else if (ckpt_source_read(cat, s->source, s->offset, (char *)buf + fill, s->length,
                                        what, err) != 0) {
                return CLI_SOURCE;
            }
            fill += s->length;
        }
        int rc = sink(ctx, buf, fill);
        if (rc) return rc;
        pos += done;
    }
    return 0;
}
