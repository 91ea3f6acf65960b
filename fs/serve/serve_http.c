/* The HTTP side of `ckptfs serve` (libmicrohttpd, a thread pool of epoll loops): the parts of
 * the Hub's API that its clients use (huggingface_hub, @huggingface/hub), the files themselves
 * with HEAD and single ranges, and the HTML pages.
 *
 * Bodies are streamed: a file's bytes are planned and read a block at a time into the
 * response's own buffer, so memory does not grow with file sizes, and each block is checked
 * against its sources before it goes out (never sendfile, see file_response). */
#include "serve.h"
#include "serve_guard.h"
#include "common/message.h"

#include "core/read/segread.h"
#include "core/util/sha256.h"
#include "core/util/strbuf.h"
#include "core/util/text.h"

#include <errno.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

enum {
    BODY_BLOCK = 256 * 1024, /* bytes read per callback: the response buffer of a download */
    PLAN_BATCH = 64,         /* segments planned per step */
};

static serve_config *config_of(void *cls) {
    return cls;
}

/* ---- responses ---- */

static enum MHD_Result send_buffer(struct MHD_Connection *c, unsigned status, const char *type,
                                   char *text, size_t len) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, text ? text : (char *)"", MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* A Hub-style error: JSON body, X-Error-Code (clients branch on it) and X-Error-Message. */
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *code,
                                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *code,
                                  const char *fmt, ...) {
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20) *p = ' '; /* never a header split */
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"error\":");
    sb_json_str(&sb, msg, strlen(msg));
    sb_puts(&sb, "}\n");
    size_t len = 0;
    char *body = sb_take(&sb, &len);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(body ? len : 0, body ? body : (char *)"",
                                        body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (code) MHD_add_response_header(r, "X-Error-Code", code);
    MHD_add_response_header(r, "X-Error-Message", msg);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, "Allow", "GET, HEAD");
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"ckptfs\"");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, strbuf *sb, const char *commit) {
    if (sb->failed) {
        sb_free(sb);
        return send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, "out of memory");
    }
    size_t len = 0;
    char *text = sb_take(sb, &len);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json; charset=utf-8");
    if (commit) MHD_add_response_header(r, "X-Repo-Commit", commit);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- file bodies ---- */

typedef struct body {
    serve_snapshot *snap;
    uint32_t node;
    uint64_t start, len; /* the range of the file sent */
    const char *mem;     /* a generated document, or NULL: read through the planner */
    char *owned;
} body;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void make_scratch_key(void) {
    pthread_key_create(&scratch_key, free);
}

/* The gather window of core/read/segread.c, one per server thread. */
static char *thread_scratch(void) {
    pthread_once(&scratch_once, make_scratch_key);
    char *p = pthread_getspecific(scratch_key);
    if (!p && (p = malloc(SEGREAD_SCRATCH))) pthread_setspecific(scratch_key, p);
    return p;
}

static ssize_t body_read(void *cls, uint64_t pos, char *buf, size_t max) {
    body *b = cls;
    if (pos >= b->len) return MHD_CONTENT_READER_END_OF_STREAM;
    size_t want = b->len - pos < max ? (size_t)(b->len - pos) : max;
    if (b->mem) {
        memcpy(buf, b->mem + b->start + pos, want);
        return (ssize_t)want;
    }
    char *scratch = thread_scratch();
    size_t filled = 0;
    while (filled < want) {
        ckpt_segment seg[PLAN_BATCH];
        uint64_t done;
        size_t n = tree_plan(&b->snap->tr, &b->snap->tr.nodes[b->node], b->start + pos + filled,
                             want - filled, seg, PLAN_BATCH, &done);
        if (n == 0 || done == 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        for (size_t i = 0; i < n; i++)
            if (seg[i].kind == CKPT_SEG_HOLE) return MHD_CONTENT_READER_END_WITH_ERROR;
        /* A source that shrank, vanished or changed in place ends the body early: MHD closes
         * the connection, the client sees a short transfer, never bytes of another file. */
        if (ckpt_read_segments(b->snap->cat, seg, n, buf + filled, scratch))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        filled += done;
    }
    return (ssize_t)filled;
}

static void body_free(void *cls) {
    body *b = cls;
    serve_snapshot_put(b->snap);
    free(b->owned);
    free(b);
}

/* ---- ranges ---- */

enum range_result { RANGE_NONE, RANGE_ONE, RANGE_UNSATISFIABLE, RANGE_MANY };

static bool parse_u64(const char **p, uint64_t *out) {
    const char *s = *p;
    if (*s < '0' || *s > '9') return false;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++)
        v = v > (UINT64_MAX - 9) / 10 ? UINT64_MAX : v * 10 + (uint64_t)(*s - '0');
    *p = s;
    *out = v;
    return true;
}

/* RFC 9110 14.1.2. Multi-range lists are refused outright (they cost a multipart body for
 * nothing the Hub clients ask, and are the usual range abuse); a header that does not parse is
 * ignored, as the RFC says. */
static enum range_result parse_range(const char *h, uint64_t size, uint64_t *start, uint64_t *len) {
    if (!h) return RANGE_NONE;
    while (*h == ' ' || *h == '\t') h++;
    if (strncasecmp(h, "bytes", 5) != 0) return RANGE_NONE;
    h += 5;
    while (*h == ' ' || *h == '\t') h++;
    if (*h++ != '=') return RANGE_NONE;
    if (strchr(h, ',')) return RANGE_MANY;
    while (*h == ' ' || *h == '\t') h++;
    uint64_t a = 0, b = UINT64_MAX;
    bool suffix = *h == '-';
    if (suffix) {
        h++;
        if (!parse_u64(&h, &b)) return RANGE_NONE;
    } else {
        if (!parse_u64(&h, &a) || *h++ != '-') return RANGE_NONE;
        if (*h >= '0' && *h <= '9') {
            parse_u64(&h, &b);
            if (b < a) return RANGE_NONE;
        }
    }
    while (*h == ' ' || *h == '\t') h++;
    if (*h) return RANGE_NONE;
    if (suffix) {
        if (b == 0 || size == 0) return RANGE_UNSATISFIABLE;
        *len = b < size ? b : size;
        *start = size - *len;
        return RANGE_ONE;
    }
    if (a >= size) return RANGE_UNSATISFIABLE;
    *start = a;
    *len = (b >= size - 1 ? size - 1 : b) - a + 1;
    return RANGE_ONE;
}

/* ---- repo routing helpers ---- */

/* The repo whose id ORG/NAME starts rest (followed by its end or a '/'); *rest moves past it
 * and the '/'. */
static serve_repo *find_repo(serve_config *cfg, const char **rest) {
    for (size_t i = 0; i < cfg->nrepos; i++) {
        size_t len = strlen(cfg->repos[i].name);
        if (strncmp(*rest, cfg->repos[i].name, len) == 0 &&
            ((*rest)[len] == '\0' || (*rest)[len] == '/')) {
            *rest += len + ((*rest)[len] == '/');
            return &cfg->repos[i];
        }
    }
    return NULL;
}

static bool revision_ok(const serve_snapshot *s, const char *rev, size_t len) {
    return (len == 4 && memcmp(rev, "main", 4) == 0) ||
           (len == SERVE_SHA_HEX && memcmp(rev, s->sha, SERVE_SHA_HEX) == 0);
}

/* A file's id: its path and size under the repo's commit (the content's digest would mean
 * reading the whole file). 64 hex digits; Hub oids are the first 40. */
static void file_id(const serve_snapshot *s, const char *path, uint64_t size, char *hex) {
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, s->sha, SERVE_SHA_HEX);
    sha256_update(&c, path, strlen(path) + 1);
    sha256_update(&c, &size, sizeof size);
    uint8_t d[SHA256_DIGEST_LEN];
    sha256_final(&c, d);
    sha256_hex(d, hex);
}

static void iso_time(time_t t, char *out, size_t n) {
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, n, "%Y-%m-%dT%H:%M:%S.000Z", &tm);
}

/* ---- API: repo info ---- */

static enum MHD_Result api_info(struct MHD_Connection *c, const serve_repo *r,
                                const serve_snapshot *s) {
    strbuf sb;
    sb_init(&sb);
    char when[40];
    iso_time(s->modified, when, sizeof when);
    sb_printf(&sb, "{\"_id\":\"%.24s\",\"id\":\"%s\",\"modelId\":\"%s\",\"author\":\"%.*s\",",
              s->sha, r->name, r->name, (int)strcspn(r->name, "/"), r->name);
    sb_printf(&sb,
              "\"sha\":\"%s\",\"lastModified\":\"%s\",\"createdAt\":\"%s\","
              "\"private\":false,\"disabled\":false,\"gated\":false,\"downloads\":0,\"likes\":0,"
              "\"library_name\":\"transformers\",\"tags\":[\"safetensors\",\"ckptfs\"],",
              s->sha, when, when);
    /* Parameters by dtype of what the HF view holds, as the Hub's "safetensors" member. */
    uint64_t params[CKPT_DTYPE_COUNT] = {0}, total = 0;
    for (size_t i = 0; i < s->view.norder; i++) { /* not its files' parts: some are runs */
        const ckpt_tensor *t = &s->cat->tensors[s->view.order[i]];
        params[t->dtype] += t->numel;
        total += t->numel;
    }
    sb_puts(&sb, "\"safetensors\":{\"parameters\":{");
    bool first = true;
    for (int d = 0; d < CKPT_DTYPE_COUNT; d++) {
        if (!params[d]) continue;
        sb_printf(&sb, "%s\"%s\":%llu", first ? "" : ",", ckpt_dtype_info_of((ckpt_dtype)d)->name,
                  (unsigned long long)params[d]);
        first = false;
    }
    sb_printf(&sb, "},\"total\":%llu},\"siblings\":[", (unsigned long long)total);
    uint32_t *files;
    size_t n = serve_view_files(s, &files);
    uint64_t used = 0;
    strbuf path;
    sb_init(&path);
    for (size_t i = 0; i < n; i++) {
        sb_clear(&path);
        serve_node_path(s, files[i], &path);
        uint64_t size = serve_node_size(s, files[i]);
        char id[SHA256_HEX_LEN + 1];
        file_id(s, path.data ? path.data : "", size, id);
        sb_puts(&sb, i ? ",{\"rfilename\":" : "{\"rfilename\":");
        sb_json_str(&sb, path.data ? path.data : "", path.len);
        sb_printf(&sb, ",\"size\":%llu,\"blobId\":\"%.40s\"}", (unsigned long long)size, id);
        used += size;
    }
    free(files);
    sb_free(&path);
    sb_printf(&sb, "],\"usedStorage\":%llu}\n", (unsigned long long)used);
    return send_json(c, &sb, s->sha);
}

/* ---- API: tree listing ---- */

static void tree_entry(strbuf *sb, const serve_snapshot *s, uint32_t i, bool *first, strbuf *path) {
    sb_clear(path);
    serve_node_path(s, i, path);
    bool dir = s->tr.nodes[i].kind == NODE_DIR;
    uint64_t size = dir ? 0 : serve_node_size(s, i);
    char id[SHA256_HEX_LEN + 1];
    file_id(s, path->data ? path->data : "", size, id);
    sb_puts(sb, *first ? "{\"type\":" : ",{\"type\":");
    *first = false;
    sb_puts(sb, dir ? "\"directory\"" : "\"file\"");
    sb_printf(sb, ",\"oid\":\"%.40s\",\"size\":%llu,\"path\":", id, (unsigned long long)size);
    sb_json_str(sb, path->data ? path->data : "", path->len);
    sb_putc(sb, '}');
}

/* Whether a name can be asked for: resolve refuses a path with a backslash (hostile_path), so
 * the listing leaves such entries (a tensor named a\b) out rather than promise what a snapshot
 * download would then fail on. */
static bool fetchable_name(const serve_snapshot *s, uint32_t i) {
    const node *n = &s->tr.nodes[i];
    return !memchr(n->name, '\\', n->name_len);
}

/* Entries under dir (depth first when recursive), the hidden ones and those no request can name
 * left out. An explicit stack: hostile names can nest thousands deep. */
static int list_dir(strbuf *sb, const serve_snapshot *s, uint32_t dir, bool recursive, bool *first,
                    strbuf *path) {
    size_t cap = 64, depth = 0;
    struct frame {
        uint32_t dir, next;
    } *stack = malloc(cap * sizeof *stack);
    if (!stack) return -ENOMEM;
    stack[depth++] = (struct frame){dir, 0};
    while (depth) {
        struct frame *f = &stack[depth - 1];
        const node *d = &s->tr.nodes[f->dir];
        if (f->next >= d->nchildren) {
            depth--;
            continue;
        }
        uint32_t c = s->tr.children[d->first_child + f->next++];
        if (!serve_node_shown(s, c) && !serve_in_view(s, c)) continue;
        if (!fetchable_name(s, c)) continue;
        tree_entry(sb, s, c, first, path);
        if (recursive && s->tr.nodes[c].kind == NODE_DIR) {
            if (depth == cap) {
                struct frame *more = realloc(stack, 2 * cap * sizeof *stack);
                if (!more) {
                    free(stack);
                    return -ENOMEM;
                }
                stack = more;
                cap *= 2;
            }
            stack[depth++] = (struct frame){c, 0};
        }
    }
    free(stack);
    return 0;
}

static bool query_true(struct MHD_Connection *c, const char *key) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
    return v && (strcasecmp(v, "true") == 0 || strcmp(v, "1") == 0);
}

static enum MHD_Result api_tree(struct MHD_Connection *c, const serve_snapshot *s,
                                const char *path) {
    uint32_t at = serve_lookup(s, path);
    if (at == SERVE_NODE_NONE)
        return send_error(c, MHD_HTTP_NOT_FOUND, "EntryNotFound", "%.200s: no such directory",
                          path);
    if (at != SERVE_NODE_ROOT && s->tr.nodes[at].kind != NODE_DIR)
        return send_error(c, MHD_HTTP_NOT_FOUND, "EntryNotFound", "%.200s: not a directory", path);
    bool recursive = query_true(c, "recursive");
    strbuf sb, p;
    sb_init(&sb);
    sb_init(&p);
    sb_putc(&sb, '[');
    bool first = true;
    int rc = 0;
    if (at == SERVE_NODE_ROOT) {
        if (s->hf_dir != SERVE_NODE_NONE) rc = list_dir(&sb, s, s->hf_dir, recursive, &first, &p);
        /* tensors/ as a directory only: a recursive listing of the repo is what a client
         * downloads (JS listFiles), and the tensor tree is the HF view's bytes again. Listed
         * recursively when asked for itself (tree/main/tensors?recursive=true). */
        tree_entry(&sb, s, 0, &first, &p);
    } else {
        rc = list_dir(&sb, s, at, recursive, &first, &p);
    }
    sb_puts(&sb, "]\n");
    sb_free(&p);
    if (rc) sb.failed = true;
    return send_json(c, &sb, s->sha);
}

/* ---- files ---- */

static const char *content_type(const char *path) {
    if (text_ends_with(path, ".json")) return "application/json";
    if (text_ends_with(path, ".txt") || text_ends_with(path, ".tsv"))
        return "text/plain; charset=utf-8";
    return "application/octet-stream";
}

/* A response of [start, start+len) of the file, always streamed through body_read: each block
 * is read, then its sources are checked, and only then handed to the connection, so a source
 * changed in place mid-response ends the body short (the connection is closed) instead of
 * completing it with new bytes. sendfile would save a copy, but once it is queued nothing looks
 * at the source again until the last byte is out. */
static struct MHD_Response *file_response(serve_snapshot *s, uint32_t i, uint64_t start,
                                          uint64_t len, bool *took) {
    body *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->snap = s;
    b->node = i;
    b->start = start;
    b->len = len;
    size_t mem_len = 0;
    b->mem = serve_node_text(s, i, &mem_len, &b->owned);
    struct MHD_Response *r =
        MHD_create_response_from_callback(len, BODY_BLOCK, body_read, b, body_free);
    if (!r) {
        free(b->owned);
        free(b);
    }
    *took = r != NULL; /* body_free gives the snapshot back */
    return r;
}

static enum MHD_Result resolve_file(struct MHD_Connection *c, serve_snapshot *s, const char *path,
                                    bool *took) {
    uint32_t i = serve_lookup(s, path);
    if (i == SERVE_NODE_NONE || i == SERVE_NODE_ROOT || s->tr.nodes[i].kind == NODE_DIR)
        return send_error(c, MHD_HTTP_NOT_FOUND, "EntryNotFound", "%.200s: no such file", path);
    if (!tree_node_current(&s->tr, &s->tr.nodes[i], false)) /* a status goes out first */
        return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL,
                          "%.200s: a source file changed; ask again", path);
    uint64_t size = serve_node_size(s, i);
    /* the content's sha256, as the Hub's LFS ETag: huggingface_hub names its blob by it */
    char etag[SHA256_HEX_LEN + 3] = "\"";
    if (serve_content_sha(s, i, size, etag + 1) != 0)
        return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL,
                          "%.200s: its bytes could not be read to name them; ask again", path);
    strcat(etag, "\"");
    const char *inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match");
    unsigned status = MHD_HTTP_OK;
    uint64_t start = 0, len = size;
    struct MHD_Response *r;
    if (inm && (strstr(inm, etag) || strcmp(inm, "*") == 0)) {
        status = MHD_HTTP_NOT_MODIFIED;
        r = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
    } else {
        const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
        const char *if_range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-Range");
        if (if_range && strcmp(if_range, etag) != 0) range = NULL;
        switch (parse_range(range, size, &start, &len)) {
        case RANGE_NONE:
            break;
        case RANGE_ONE:
            status = MHD_HTTP_PARTIAL_CONTENT;
            break;
        case RANGE_MANY:
        case RANGE_UNSATISFIABLE: {
            char cr[64];
            snprintf(cr, sizeof cr, "bytes */%llu", (unsigned long long)size);
            struct MHD_Response *e =
                MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
            if (!e) return MHD_NO;
            MHD_add_response_header(e, "Content-Range", cr);
            MHD_add_response_header(e, "X-Error-Message",
                                    strchr(range, ',') ? "one range per request"
                                                       : "range not satisfiable");
            enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_RANGE_NOT_SATISFIABLE, e);
            MHD_destroy_response(e);
            return ret;
        }
        }
        r = file_response(s, i, start, len, took);
    }
    if (!r) return send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, "out of memory");
    char num[32];
    MHD_add_response_header(r, "ETag", etag);
    MHD_add_response_header(r, "X-Linked-Etag", etag);
    snprintf(num, sizeof num, "%llu", (unsigned long long)size);
    MHD_add_response_header(r, "X-Linked-Size", num);
    MHD_add_response_header(r, "X-Repo-Commit", s->sha);
    /* the newest mtime of the sources (an hf:// mount of this repo shows it as the files') */
    char when[64];
    struct tm tm;
    gmtime_r(&s->modified, &tm);
    strftime(when, sizeof when, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    MHD_add_response_header(r, "Last-Modified", when);
    MHD_add_response_header(r, "Accept-Ranges", "bytes");
    MHD_add_response_header(r, "Content-Type", content_type(path));
    if (status == MHD_HTTP_PARTIAL_CONTENT) {
        char cr[80];
        snprintf(cr, sizeof cr, "bytes %llu-%llu/%llu", (unsigned long long)start,
                 (unsigned long long)(start + len - 1), (unsigned long long)size);
        MHD_add_response_header(r, "Content-Range", cr);
    }
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- authentication ---- */

/* Compares digests of both tokens, so the time taken depends on neither the token's length
 * nor how many leading bytes a guess got right. */
static bool token_ok(const serve_config *cfg, struct MHD_Connection *c) {
    if (!cfg->token) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    uint8_t a[SHA256_DIGEST_LEN], b[SHA256_DIGEST_LEN];
    sha256(h + 7, strlen(h + 7), a);
    sha256(cfg->token, strlen(cfg->token), b);
    uint8_t diff = 0;
    for (size_t i = 0; i < sizeof a; i++) diff |= (uint8_t)(a[i] ^ b[i]);
    return diff == 0;
}

/* ---- routing ---- */

/* The next '/'-separated component of *p (advancing past it), or NULL at the end. */
static const char *component(const char **p, size_t *len) {
    const char *s = *p;
    if (!*s) return NULL;
    const char *slash = strchr(s, '/');
    *len = slash ? (size_t)(slash - s) : strlen(s);
    *p = slash ? slash + 1 : s + *len;
    return s;
}

static bool hostile_path(const char *url) {
    for (const char *p = url; *p;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.')) return true;
        if (memchr(p, '\\', len)) return true;
        p += len + (slash != NULL);
    }
    return false;
}

static enum MHD_Result repo_page(struct MHD_Connection *c, serve_repo *r, serve_snapshot *s) {
    size_t len = 0;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    char *html = serve_html_repo(r, s, host, &len);
    if (!html) return send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, "out of memory");
    return send_buffer(c, MHD_HTTP_OK, "text/html; charset=utf-8", html, len);
}

static enum MHD_Result plot_page(struct MHD_Connection *c, serve_snapshot *s) {
    size_t len = 0;
    const char *svg = NULL;
    int state = serve_plot(s, c, &svg, &len);
    if (state == SERVE_PLOT_DRAWING) return MHD_YES; /* suspended: asked again once drawn */
    if (state < 0) return send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, "out of memory");
    if (!svg)
        return send_error(c, MHD_HTTP_NOT_FOUND, "EntryNotFound",
                          "no tensor has a layer number (or statistics failed)");
    char *copy = malloc(len ? len : 1);
    if (!copy) return send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, "out of memory");
    memcpy(copy, svg, len);
    return send_buffer(c, MHD_HTTP_OK, "image/svg+xml", copy, len);
}

static bool is_word(const char *s, size_t len, const char *word) {
    return len == strlen(word) && memcmp(s, word, len) == 0;
}

/* /api/models/ORG/NAME[/revision/REV | /tree/REV[/PATH]] and
 * /ORG/NAME[/resolve/REV/PATH | /layers.svg]. */
static enum MHD_Result route_repo(struct MHD_Connection *c, serve_config *cfg, const char *rest,
                                  bool api) {
    const char *asked = rest;
    serve_repo *r = find_repo(cfg, &rest);
    if (!r) return send_error(c, MHD_HTTP_NOT_FOUND, "RepoNotFound", "no repository %.100s", asked);
    enum { K_NONE, K_REVISION, K_TREE, K_RESOLVE, K_PLOT, K_OTHER } k = K_NONE;
    size_t klen = 0, rlen = 0;
    const char *kind = component(&rest, &klen), *rev = NULL;
    if (kind)
        k = is_word(kind, klen, "revision")     ? K_REVISION
            : is_word(kind, klen, "tree")       ? K_TREE
            : is_word(kind, klen, "resolve")    ? K_RESOLVE
            : is_word(kind, klen, "layers.svg") ? K_PLOT
                                                : K_OTHER;
    bool wants_rev = k == K_REVISION || k == K_TREE || k == K_RESOLVE;
    if (wants_rev) rev = component(&rest, &rlen);
    if (k == K_OTHER || (api && (k == K_RESOLVE || k == K_PLOT)) ||
        (!api && (k == K_REVISION || k == K_TREE)) ||
        ((k == K_NONE || k == K_REVISION || k == K_PLOT) && *rest) || (k == K_RESOLVE && !*rest))
        return send_error(c, MHD_HTTP_NOT_FOUND, "EntryNotFound", "no such page");
    char why[800];
    serve_snapshot *s = serve_repo_get(r, why, sizeof why);
    if (!s) return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "%s", why);
    bool took = false;
    enum MHD_Result ret;
    if (wants_rev && (!rev || !revision_ok(s, rev, rlen)))
        ret = send_error(c, MHD_HTTP_NOT_FOUND, "RevisionNotFound",
                         "revision %.*s: this repo has main and %s",
                         rev ? (int)(rlen > 60 ? 60 : rlen) : 0, rev ? rev : "", s->sha);
    else if (k == K_NONE || k == K_REVISION)
        ret = api ? api_info(c, r, s) : repo_page(c, r, s);
    else if (k == K_TREE)
        ret = api_tree(c, s, rest);
    else if (k == K_PLOT)
        ret = plot_page(c, s);
    else
        ret = resolve_file(c, s, rest, &took);
    if (!took) serve_snapshot_put(s);
    return ret;
}

static enum MHD_Result api_models(struct MHD_Connection *c, serve_config *cfg) {
    strbuf sb;
    sb_init(&sb);
    sb_putc(&sb, '[');
    for (size_t i = 0; i < cfg->nrepos; i++) {
        char why[800];
        serve_snapshot *s = serve_repo_get(&cfg->repos[i], why, sizeof why);
        sb_printf(&sb, "%s{\"id\":\"%s\",\"modelId\":\"%s\",\"sha\":\"%s\"}", i ? "," : "",
                  cfg->repos[i].name, cfg->repos[i].name, s ? s->sha : "");
        serve_snapshot_put(s);
    }
    sb_puts(&sb, "]\n");
    return send_json(c, &sb, NULL);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls) {
    (void)version;
    (void)upload_data;
    static int seen;
    serve_config *cfg = config_of(cls);
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        *upload_data_size = 0; /* a body is never read: the connection closes after the 405 */
        return send_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, NULL,
                          "%.20s: this server is read-only (GET and HEAD only)", method);
    }
    /* Answering on the first call, before the library has seen the end of the request, costs
     * the connection its keep-alive: answer on the second. */
    if (!*con_cls) {
        *con_cls = &seen;
        return MHD_YES;
    }
    *upload_data_size = 0;
    serve_guard_request(c); /* its headers are whole: no longer bound by the header time */
    if (!token_ok(cfg, c)) {
        /* Closed after the answer: a client without the token holds no slot for longer than
         * its headers took. */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 1u);
        return send_error(c, MHD_HTTP_UNAUTHORIZED, NULL, "a valid Bearer token is required");
    }
    if (url[0] != '/' || hostile_path(url))
        return send_error(c, MHD_HTTP_BAD_REQUEST, NULL, "bad path");
    if (strcmp(url, "/") == 0) {
        size_t len = 0;
        char *html = serve_html_index(cfg->repos, cfg->nrepos, &len);
        if (!html) return send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, "out of memory");
        return send_buffer(c, MHD_HTTP_OK, "text/html; charset=utf-8", html, len);
    }
    if (strcmp(url, "/api/models") == 0) return api_models(c, cfg);
    if (strncmp(url, "/api/models/", 12) == 0) return route_repo(c, cfg, url + 12, true);
    if (strncmp(url, "/api/", 5) != 0) return route_repo(c, cfg, url + 1, false);
    return send_error(c, MHD_HTTP_NOT_FOUND, "RepoNotFound", "no such page");
}

/* Percent-decoding in place, except %00: a NUL would cut the path short in C strings, so
 * "model.safetensors%00.txt" would name model.safetensors. Left encoded it names nothing. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls;
    (void)c;
    char *out = s;
    for (const char *in = s; *in;) {
        int hi, lo;
        if (in[0] == '%' && (hi = text_hex_digit(in[1])) >= 0 &&
            (lo = text_hex_digit(in[2])) >= 0 && (hi | lo) != 0) {
            *out++ = (char)(hi * 16 + lo);
            in += 3;
        } else {
            *out++ = *in++;
        }
    }
    *out = '\0';
    return (size_t)(out - s);
}

static void request_done(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)con_cls;
    (void)toe;
    serve_guard_completed(c); /* waiting for its next request, within the header time */
}

static serve_guard *guard; /* one server a process */

/* libmicrohttpd's own messages end in a newline of their own; the rest is shown as ours. */
static void log_mhd(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char text[1024];
    vsnprintf(text, sizeof text, fmt, ap);
    text[strcspn(text, "\n")] = '\0';
    msg_error("serve", "%s", text);
}

struct MHD_Daemon *serve_http_start(serve_config *cfg, const void *addr, unsigned addrlen,
                                    char *msg, size_t msg_len) {
    const struct sockaddr *sa = addr;
    /* Suspend/resume: a request for layers.svg waits for its drawing without a thread. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG |
                     MHD_ALLOW_SUSPEND_RESUME;
    if (sa->sa_family == AF_INET6) flags |= MHD_USE_IPv6;
    (void)addrlen;
    /* Half the slots at most for connections still sending their headers: the other half stay
     * for requests (see serve_guard.h). */
    guard = serve_guard_start(cfg->max_connections / 2, SERVE_HEADER_SECONDS);
    if (!guard) {
        snprintf(msg, msg_len, "cannot start the connection guard: out of memory");
        return NULL;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, handle, cfg, MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
        MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_THREAD_POOL_SIZE, cfg->threads,
        MHD_OPTION_CONNECTION_LIMIT, cfg->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, cfg->timeout,
        /* Request line and headers must fit: larger ones are refused with 431 by the library. */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_UNESCAPE_CALLBACK,
        unescape, NULL, MHD_OPTION_NOTIFY_CONNECTION, serve_guard_connection, guard,
        MHD_OPTION_NOTIFY_COMPLETED, request_done, NULL, MHD_OPTION_END);
    if (!d) {
        snprintf(msg, msg_len, "cannot listen: %s", strerror(errno));
        serve_guard_stop(guard);
        guard = NULL;
    }
    return d;
}

unsigned serve_http_port(struct MHD_Daemon *d) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    return info ? info->port : 0;
}

void serve_http_stop(struct MHD_Daemon *d) {
    if (d) MHD_stop_daemon(d);
    serve_guard_stop(guard); /* after the daemon: no connection is left to notify it */
    guard = NULL;
}
