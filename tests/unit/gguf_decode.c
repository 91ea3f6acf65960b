/* GGUF decoder: what a small file decodes to (shapes, types, the exact JSON of every KV type),
 * then thousands of mutated copies of it, which must each be refused with a message or opened
 * safely (run under SANITIZE=1 this is a small fuzzer). */
#include "model/catalog.h"
#include "tap.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct buf {
    unsigned char data[8192];
    size_t len;
} buf;

static void put(buf *b, const void *p, size_t n) {
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void u32(buf *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b->data[b->len++] = (unsigned char)(v >> (8 * i));
}

static void u64(buf *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b->data[b->len++] = (unsigned char)(v >> (8 * i));
}

static void str(buf *b, const char *s) {
    u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void f32(buf *b, float f) {
    uint32_t v;
    memcpy(&v, &f, 4);
    u32(b, v);
}

enum { MUTATIONS = 3000 };

enum { U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 };

static void build(buf *b) {
    b->len = 0;
    put(b, "GGUF", 4);
    u32(b, 3);
    u64(b, 3); /* tensors */
    u64(b, 7); /* KVs */
    str(b, "general.architecture");
    u32(b, STRING);
    str(b, "llama");
    str(b, "f");
    u32(b, ARRAY);
    u32(b, F32);
    u64(b, 6);
    f32(b, 0.1f);
    f32(b, 1.0f);
    f32(b, -0.0f);
    f32(b, 1e30f);
    f32(b, 0.0f / 0.0f);
    f32(b, -1.0f / 0.0f);
    str(b, "i");
    u32(b, I64);
    u64(b, (uint64_t)INT64_MIN);
    str(b, "nest");
    u32(b, ARRAY);
    u32(b, ARRAY);
    u64(b, 2);
    u32(b, I8);
    u64(b, 2);
    b->data[b->len++] = 0xff;
    b->data[b->len++] = 7;
    u32(b, STRING);
    u64(b, 1);
    str(b, "q\"\n");
    str(b, "b");
    u32(b, BOOL);
    b->data[b->len++] = 1;
    str(b, "general.alignment");
    u32(b, U32);
    u32(b, 16);
    str(b, "u16");
    u32(b, U16);
    b->data[b->len++] = 0x34;
    b->data[b->len++] = 0x12;
    /* tensor infos: offsets relative to the data section, aligned to 16 */
    str(b, "w");
    u32(b, 2);
    u64(b, 3);
    u64(b, 2);
    u32(b, 0); /* F32 [2, 3]: 24 bytes */
    u64(b, 0);
    str(b, "q");
    u32(b, 2);
    u64(b, 32);
    u64(b, 2);
    u32(b, 8); /* Q8_0 [2, 32]: 68 bytes */
    u64(b, 32);
    str(b, "s");
    u32(b, 0);
    u32(b, 30); /* BF16 scalar: 2 bytes */
    u64(b, 112);
    while (b->len % 16) b->data[b->len++] = 0;
    for (int i = 0; i < 128; i++) b->data[b->len++] = (unsigned char)i;
}

/* Rewrites in place: truncating to zero first would make ext4 flush the old data each time. */
static int write_file(const char *path, const void *p, size_t n) {
    int fd = open(path, O_WRONLY);
    if (fd < 0) return -1;
    int rc = pwrite(fd, p, n, 0) == (ssize_t)n && ftruncate(fd, (off_t)n) == 0 ? 0 : -1;
    return close(fd) == 0 ? rc : -1;
}

static const ckpt_tensor *find(const ckpt_catalog *cat, const char *name) {
    for (size_t i = 0; i < cat->ntensors; i++)
        if (cat->tensors[i].name_len == strlen(name) &&
            !memcmp(cat->tensors[i].name, name, strlen(name)))
            return &cat->tensors[i];
    return NULL;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

int main(void) {
    char path[] = "/tmp/ckpt-gguf-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 1;
    close(fd);
    static buf good;
    build(&good);
    if (write_file(path, good.data, good.len)) return 1;

    ckpt_catalog *cat;
    ckpt_err err = {{0}};
    int rc = ckpt_open(path, NULL, &cat, &err);
    ok(rc == 0, "small GGUF opens (%s)", rc ? err.msg : "ok");
    if (rc) return tap_done();
    ok(strcmp(cat->format, "gguf") == 0, "format is gguf");
    is_u64(cat->ntensors, 3, "three tensors");
    const ckpt_tensor *w = find(cat, "w"), *q = find(cat, "q"), *s = find(cat, "s");
    ok(w && w->dtype == CKPT_F32 && w->ndim == 2 && w->shape[0] == 2 && w->shape[1] == 3,
       "ne [3, 2] F32 becomes shape [2, 3]");
    ok(q && q->dtype == CKPT_Q8_0 && q->nbytes == 68, "Q8_0 [2, 32] is 68 bytes");
    ok(s && s->dtype == CKPT_BF16 && s->ndim == 0 && s->nbytes == 2, "n_dims 0 is a scalar");
    size_t data = good.len - 128;
    ok(w && w->npieces == 1 && w->pieces[0].file_offset == data, "w at the data section");
    ok(q && q->pieces[0].file_offset == data + 32, "q at data + 32 (alignment 16)");
    strbuf q_extra;
    sb_init(&q_extra);
    bool has_extra = q && ckpt_tensor_extra(q, &q_extra);
    sb_putc(&q_extra, '\0');
    ok(has_extra && !q_extra.failed &&
           strcmp(q_extra.data, "\"ggml_type\": \"Q8_0\", \"ggml_type_id\": 8, "
                                "\"block_size\": 32, \"type_size\": 34") == 0,
       "sidecar extras of q: %s", has_extra && !q_extra.failed ? q_extra.data : "(none)");
    sb_free(&q_extra);
    size_t len;
    char *meta = ckpt_metadata_json(cat, &len);
    static const char *const want[] = {
        "\"general.architecture\": \"llama\"",
        "\"f\": [0.1, 1.0, -0.0, 1e+30, \"NaN\", \"-Infinity\"]",
        "\"i\": -9223372036854775808",
        "\"nest\": [[-1, 7], [\"q\\\"\\n\"]]",
        "\"b\": true",
        "\"general.alignment\": 16",
        "\"u16\": 4660",
        "\"gguf_files\": [{\"file\": ",
        "\"version\": 3, \"tensor_count\": 3, \"kv_count\": 7, \"alignment\": 16",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        ok(meta && strstr(meta, want[i]), "metadata.json has %s", want[i]);
    if (meta && tap_failed) printf("# %s\n", meta);
    free(meta);
    ckpt_close(cat);

    /* Edge files that must open: a bare header, and an empty string ending at the last byte. */
    static buf edge;
    edge.len = 0;
    put(&edge, "GGUF", 4);
    u32(&edge, 2);
    u64(&edge, 0);
    u64(&edge, 0);
    if (write_file(path, edge.data, edge.len)) return 1;
    rc = ckpt_open(path, NULL, &cat, &err);
    ok(rc == 0 && cat->ntensors == 0, "a 24-byte file with no tensors and no KVs opens (%s)",
       rc ? err.msg : "ok");
    if (!rc) ckpt_close(cat);
    edge.data[16] = 1; /* kv_count 1 */
    str(&edge, "");
    u32(&edge, STRING);
    str(&edge, "");
    if (write_file(path, edge.data, edge.len)) return 1;
    rc = ckpt_open(path, NULL, &cat, &err);
    ok(rc == 0, "an empty key and an empty string value at the end of the file (%s)",
       rc ? err.msg : "ok");
    if (!rc) {
        meta = ckpt_metadata_json(cat, &len);
        ok(meta && strstr(meta, "\"gguf\": {\n    \"\": \"\"\n  }"), "shown as {\"\": \"\"}");
        free(meta);
        ckpt_close(cat);
    }

    /* Mutations: truncations, random bytes, and extreme values in 8-byte slots. */
    static const uint64_t extremes[] = {0,
                                        1,
                                        3,
                                        31,
                                        0x7fffffffffffffffull,
                                        0x8000000000000000ull,
                                        UINT64_MAX,
                                        0xffffffffull,
                                        1ull << 32,
                                        4096};
    static buf m;
    int opened = 0, refused = 0, silent = 0, multiline = 0;
    for (int iter = 0; iter < MUTATIONS; iter++) {
        m = good;
        uint64_t r = next();
        switch (r % 4) {
        case 0:
            m.len = (size_t)(next() % good.len);
            break;
        case 1:
            for (int k = 0; k < 1 + (int)(next() % 3); k++)
                m.data[4 + next() % (good.len - 4)] = (unsigned char)next();
            break;
        case 2: {
            size_t at = 8 + next() % (good.len - 16);
            uint64_t v = extremes[next() % (sizeof extremes / sizeof *extremes)];
            for (int i = 0; i < 8; i++) m.data[at + i] = (unsigned char)(v >> (8 * i));
            break;
        }
        default: {
            size_t at = 8 + next() % (good.len - 12);
            uint32_t v = (uint32_t)extremes[next() % (sizeof extremes / sizeof *extremes)];
            if (next() % 2) v = (uint32_t)(next() % 48);
            for (int i = 0; i < 4; i++) m.data[at + i] = (unsigned char)(v >> (8 * i));
        }
        }
        if (write_file(path, m.data, m.len)) return 1;
        err.msg[0] = '\0';
        rc = ckpt_open(path, NULL, &cat, &err);
        if (rc == 0) {
            opened++;
            char *doc = ckpt_metadata_json(cat, &len);
            free(doc);
            ckpt_close(cat);
        } else {
            refused++;
            if (!err.msg[0]) silent++;
            if (strchr(err.msg, '\n')) multiline++;
        }
    }
    printf("# mutations: %d opened, %d refused\n", opened, refused);
    ok(silent == 0 && multiline == 0 && refused > MUTATIONS / 2,
       "%d mutated files: each opens or is refused with a one-line message "
       "(%d silent, %d multi-line)",
       MUTATIONS, silent, multiline);
    unlink(path);
    return tap_done();
}
