/* The content ETag of a served file: the sha256 of its bytes, as the Hub gives for LFS files
 * (huggingface_hub names its cached blob by it). It costs one read of the whole file, through
 * the planner as a download reads it, on the first request for that file in a snapshot (a HEAD
 * of a 5 GB shard waits for that read, about as long as a local copy of it); the digest is kept
 * for the snapshot's life, so every later request, and every file of an unchanged source,
 * answers at once. A snapshot opened again after a change hashes again. */
#include "serve.h"

#include "core/read/segread.h"
#include "core/util/sha256.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct known {
    uint32_t node;
    char hex[SHA256_HEX_LEN + 1];
} known;

struct serve_etags {
    pthread_mutex_t lock; /* one file hashed at a time; lookups wait for it */
    known *k;             /* by node, ascending */
    size_t n, cap;
};

static pthread_mutex_t make_lock = PTHREAD_MUTEX_INITIALIZER;

static void etags_free(struct serve_etags *e);

static struct serve_etags *etags_of(serve_snapshot *s) {
    pthread_mutex_lock(&make_lock);
    if (!s->etags && (s->etags = calloc(1, sizeof *s->etags))) {
        pthread_mutex_init(&s->etags->lock, NULL);
        s->etags_free = etags_free;
    }
    struct serve_etags *e = s->etags;
    pthread_mutex_unlock(&make_lock);
    return e;
}

static void etags_free(struct serve_etags *e) {
    if (!e) return;
    pthread_mutex_destroy(&e->lock);
    free(e->k);
    free(e);
}

/* sha256 of the node's size bytes, read as a download reads them. */
static int hash_node(const serve_snapshot *s, uint32_t node_id, uint64_t size, char *hex) {
    sha256_ctx c;
    sha256_init(&c);
    char *owned = NULL;
    size_t mem_len = 0;
    const char *mem = serve_node_text(s, node_id, &mem_len, &owned);
    int rc = 0;
    if (mem) {
        sha256_update(&c, mem, mem_len < size ? mem_len : (size_t)size);
    } else {
        char *buf = malloc(SEGREAD_SCRATCH), *scratch = malloc(SEGREAD_SCRATCH);
        if (!buf || !scratch) rc = -ENOMEM;
        for (uint64_t at = 0; !rc && at < size;) {
            size_t want = size - at < SEGREAD_SCRATCH ? (size_t)(size - at) : SEGREAD_SCRATCH;
            ckpt_segment seg[64];
            uint64_t done;
            size_t n = tree_plan(&s->tr, &s->tr.nodes[node_id], at, want, seg, 64, &done);
            if (n == 0 || done == 0) rc = -EIO;
            for (size_t i = 0; !rc && i < n; i++)
                if (seg[i].kind == CKPT_SEG_HOLE) rc = -EIO;
            if (!rc) rc = ckpt_read_segments(s->cat, seg, n, buf, scratch);
            if (!rc) sha256_update(&c, buf, (size_t)done);
            at += done;
        }
        free(buf);
        free(scratch);
    }
    free(owned);
    if (rc) return rc;
    uint8_t d[SHA256_DIGEST_LEN];
    sha256_final(&c, d);
    sha256_hex(d, hex);
    return 0;
}

/* Where node is, or would go, in e->k. */
static size_t slot_of(const struct serve_etags *e, uint32_t node_id) {
    size_t lo = 0, hi = e->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e->k[mid].node < node_id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int serve_content_sha(serve_snapshot *s, uint32_t node_id, uint64_t size, char *hex) {
    struct serve_etags *e = etags_of(s);
    if (!e) return -ENOMEM;
    pthread_mutex_lock(&e->lock);
    size_t at = slot_of(e, node_id);
    int rc = 0;
    if (at < e->n && e->k[at].node == node_id) {
        memcpy(hex, e->k[at].hex, SHA256_HEX_LEN + 1);
    } else if (!(rc = hash_node(s, node_id, size, hex))) {
        if (e->n == e->cap) {
            size_t cap = e->cap ? 2 * e->cap : 16;
            known *more = realloc(e->k, cap * sizeof *more);
            if (more) e->k = more, e->cap = cap;
        }
        if (e->n < e->cap) { /* else it is hashed again next time */
            memmove(&e->k[at + 1], &e->k[at], (e->n - at) * sizeof *e->k);
            e->k[at].node = node_id;
            memcpy(e->k[at].hex, hex, SHA256_HEX_LEN + 1);
            e->n++;
        }
    }
    pthread_mutex_unlock(&e->lock);
    return rc;
}
