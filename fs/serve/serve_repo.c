/* A served repo: its snapshot (catalog, HF view, the mount's tree), the paths of its files and
 * their bytes. Paths are looked up in the mount's tree, so the files served are exactly the
 * files the FUSE mount shows: the HF view at the top, the tensor tree under tensors/. */
#include "serve.h"

#include "core/util/sha256.h"
#include "core/util/strbuf.h"
#include "common/view_job.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t serve_max_shard_size = CKPT_HF_MAX_SHARD_DEFAULT;

/* The commit id: a digest of what identifies every source file (path, device, inode, size,
 * mtime, ctime), so any change to a source gives a new id without reading its bytes, and of
 * the options that shape the repo's files (--max-shard-size): clients cache by commit id
 * (huggingface_hub keeps the tree listing of a commit), so other files need another id. */
static void identity_sha(const ckpt_catalog *cat, char *out) {
    sha256_ctx c;
    sha256_init(&c);
    const char *version = ckpt_version();
    sha256_update(&c, "ckptfs serve ", strlen("ckptfs serve "));
    sha256_update(&c, version, strlen(version));
    uint64_t shard = serve_max_shard_size;
    sha256_update(&c, &shard, sizeof shard);
    sha256_update(&c, cat->root, strlen(cat->root) + 1);
    for (uint32_t i = 0; i < cat->nsources; i++) {
        const ckpt_source *src = &cat->sources[i];
        uint64_t id[8] = {(uint64_t)src->dev,           (uint64_t)src->ino,
                          ckpt_source_stored_size(src), (uint64_t)src->mtime.tv_sec,
                          (uint64_t)src->mtime.tv_nsec, (uint64_t)src->ctime.tv_sec,
                          (uint64_t)src->ctime.tv_nsec, src->base};
        sha256_update(&c, src->path, strlen(src->path) + 1);
        sha256_update(&c, id, sizeof id);
    }
    uint8_t d[SHA256_DIGEST_LEN];
    sha256_final(&c, d);
    char hex[SHA256_HEX_LEN + 1];
    sha256_hex(d, hex);
    memcpy(out, hex, SERVE_SHA_HEX);
    out[SERVE_SHA_HEX] = '\0';
}

static int hand_view(void *ctx, const ckpt_hfview **view, ckpt_err *err) {
    return view_job_wait(ctx, view, err);
}

int serve_snapshot_open(const char *source, serve_snapshot **out, ckpt_err *err) {
    serve_snapshot *s = calloc(1, sizeof *s);
    if (!s) return ckpt_fail(err, -ENOMEM, "out of memory");
    atomic_init(&s->refs, 1);
    pthread_mutex_init(&s->plot_lock, NULL);
    s->hf_dir = SERVE_NODE_NONE;
    int rc = ckpt_open(source, NULL, &s->cat, err);
    if (rc) {
        serve_snapshot_put(s);
        return rc;
    }
    view_job job;
    view_job_start(&job, s->cat, serve_max_shard_size, &s->view);
    if ((rc = tree_build(&s->tr, s->cat, hand_view, &job, false, false, false, err))) {
        serve_snapshot_put(s);
        return rc;
    }
    uint32_t dot = tree_lookup(&s->tr, 0, ".ckptfs", 7);
    if (dot != UINT32_MAX) {
        uint32_t hf = tree_lookup(&s->tr, dot, "hf", 2);
        if (hf != UINT32_MAX) s->hf_dir = hf;
    }
    s->docs[DOC_SUMMARY] = ckpt_summary_json(s->cat, &s->doc_len[DOC_SUMMARY]);
    s->docs[DOC_METADATA] = ckpt_metadata_json(s->cat, &s->doc_len[DOC_METADATA]);
    s->docs[DOC_TSV] = ckpt_tensors_tsv(s->cat, &s->doc_len[DOC_TSV]);
    if (!s->docs[DOC_SUMMARY] || !s->docs[DOC_METADATA] || !s->docs[DOC_TSV]) {
        serve_snapshot_put(s);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    identity_sha(s->cat, s->sha);
    s->modified = s->tr.mtime.tv_sec;
    *out = s;
    return 0;
}

void serve_snapshot_put(serve_snapshot *s) {
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
    for (int d = 0; d < DOC_COUNT; d++) free(s->docs[d]);
    free(s->plot);
    if (s->etags_free) s->etags_free(s->etags);
    pthread_mutex_destroy(&s->plot_lock);
    tree_free(&s->tr);
    ckpt_hfview_free(&s->view);
    ckpt_close(s->cat);
    free(s);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static bool sources_current(const ckpt_catalog *cat) {
    for (uint32_t i = 0; i < cat->nsources; i++)
        if (!ckpt_source_current(&cat->sources[i])) return false;
    return true;
}

serve_snapshot *serve_repo_get(serve_repo *r, char *why, size_t why_len) {
    pthread_mutex_lock(&r->lock);
    double now = now_seconds();
    if (now - r->checked >= 1.0 || r->error[0]) {
        r->checked = now;
        if (r->error[0] || !sources_current(r->cur->cat)) {
            /* Reopened under the lock: requests for this repo wait for the new snapshot
             * rather than each opening their own. */
            serve_snapshot *fresh;
            ckpt_err err = {{0}};
            if (serve_snapshot_open(r->source, &fresh, &err) == 0) {
                serve_snapshot_put(r->cur);
                r->cur = fresh;
                r->error[0] = '\0';
            } else {
                snprintf(r->error, sizeof r->error, "%s", err.msg);
            }
        }
    }
    serve_snapshot *s = NULL;
    if (r->error[0])
        snprintf(why, why_len, "%s changed and cannot be read: %s", r->source, r->error);
    else
        atomic_fetch_add(&(s = r->cur)->refs, 1);
    pthread_mutex_unlock(&r->lock);
    return s;
}

static bool inside(const serve_snapshot *s, uint32_t i, uint32_t dir) {
    for (; i != 0; i = s->tr.nodes[i].parent)
        if (i == dir) return true;
    return dir == 0;
}

bool serve_in_view(const serve_snapshot *s, uint32_t i) {
    return s->hf_dir != SERVE_NODE_NONE && i != s->hf_dir && inside(s, i, s->hf_dir);
}

bool serve_node_shown(const serve_snapshot *s, uint32_t i) {
    const node *n = &s->tr.nodes[i];
    if (n->kind == NODE_DOC && n->ref == DOC_STATS) return false; /* reads every tensor */
    return s->hf_dir == SERVE_NODE_NONE || !inside(s, i, s->hf_dir);
}

uint32_t serve_lookup(const serve_snapshot *s, const char *path) {
    if (!*path) return SERVE_NODE_ROOT;
    const char *p = path;
    uint32_t at = s->hf_dir;
    size_t tlen = strlen(SERVE_TENSORS_DIR);
    bool tensors = strncmp(p, SERVE_TENSORS_DIR, tlen) == 0 && (p[tlen] == '/' || !p[tlen]);
    if (tensors) {
        at = 0;
        p += tlen + (p[tlen] == '/');
        if (!*p && p[-1] == '/') return SERVE_NODE_NONE; /* "tensors/" */
        if (!*p) return 0;
    }
    if (at == SERVE_NODE_NONE) return SERVE_NODE_NONE;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return SERVE_NODE_NONE;
        at = tree_lookup(&s->tr, at, p, len);
        if (at == UINT32_MAX) return SERVE_NODE_NONE;
        if (!slash) break;
        p = slash + 1;
    }
    return !tensors || serve_node_shown(s, at) ? at : SERVE_NODE_NONE;
}

void serve_node_path(const serve_snapshot *s, uint32_t i, strbuf *sb) {
    bool hf = serve_in_view(s, i);
    uint32_t top = hf ? s->hf_dir : 0;
    size_t depth = 0;
    for (uint32_t k = i; k != top && k != 0; k = s->tr.nodes[k].parent) depth++;
    /* Names can nest thousands deep: the chain goes on the heap when it is long. */
    uint32_t small[64], *chain = depth <= 64 ? small : malloc(depth * sizeof *chain);
    if (!chain) {
        sb->failed = true;
        return;
    }
    size_t d = 0;
    for (uint32_t k = i; k != top && k != 0; k = s->tr.nodes[k].parent) chain[d++] = k;
    if (!hf) sb_puts(sb, SERVE_TENSORS_DIR);
    while (d-- > 0) {
        const node *n = &s->tr.nodes[chain[d]];
        if (sb->len || !hf) sb_putc(sb, '/');
        sb_put(sb, n->name, n->name_len);
    }
    if (chain != small) free(chain);
}

size_t serve_view_files(const serve_snapshot *s, uint32_t **out) {
    *out = NULL;
    if (s->hf_dir == SERVE_NODE_NONE) return 0;
    const node *d = &s->tr.nodes[s->hf_dir];
    uint32_t *list = malloc((d->nchildren ? d->nchildren : 1) * sizeof *list);
    if (!list) return 0;
    size_t n = 0;
    for (uint32_t k = 0; k < d->nchildren; k++) {
        uint32_t c = s->tr.children[d->first_child + k];
        if (s->tr.nodes[c].kind != NODE_DIR) list[n++] = c;
    }
    *out = list;
    return n;
}

uint64_t serve_node_size(const serve_snapshot *s, uint32_t i) {
    node *n = &s->tr.nodes[i];
    if (n->kind != NODE_DOC) return tree_node_size(&s->tr, n);
    return n->ref < DOC_COUNT ? s->doc_len[n->ref] : 0;
}

const char *serve_node_text(const serve_snapshot *s, uint32_t i, size_t *len, char **owned) {
    const node *n = &s->tr.nodes[i];
    *owned = NULL;
    if (n->kind == NODE_DOC && n->ref < DOC_COUNT) {
        *len = s->doc_len[n->ref];
        return s->docs[n->ref] ? s->docs[n->ref] : "";
    }
    if (n->kind == NODE_SIDECAR) {
        *owned = tree_sidecar_text(&s->tr, n, len);
        return *owned;
    }
    return NULL;
}
