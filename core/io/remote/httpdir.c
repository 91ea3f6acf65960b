/* Plain http(s) servers: a directory is a URL whose index page links its entries (nginx
 * autoindex, Apache, python -m http.server), or one a HEAD redirects to the same path with a
 * slash; a name is a file when a HEAD of it answers 200. */
#include "listing.h"
#include "remote.h"
#include "../../util/text.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The path part of a URL (after scheme://host, before ?query or #fragment). */
static void url_path(const char *url, const char **p, size_t *n) {
    const char *s = strstr(url, "://");
    s = s ? s + 3 : url;
    s += strcspn(s, "/?#");
    *p = s;
    *n = strcspn(s, "?#");
}

/* A redirect to the same path with a slash added: how servers answer a directory named
 * without its slash (nginx, Apache, python -m http.server). */
static bool redirect_adds_slash(const char *url, const char *to) {
    const char *a, *b;
    size_t an, bn;
    url_path(url, &a, &an);
    url_path(to, &b, &bn);
    return bn == an + 1 && memcmp(a, b, an) == 0 && b[an] == '/';
}

/* An http(s) name's URL: asked of http_names.c, not of the scheme table, which lists this
 * file's functions (the table's users are above it). */
static int target_of(const char *path, remote_target *t, ckpt_err *err) {
    sb_init(&t->url);
    t->auth = NULL;
    http_target(path, t, err);
    if (!t->url.failed) return 0;
    sb_free(&t->url);
    return ckpt_fail(err, -ENOMEM, "out of memory");
}

/* One HEAD, its redirects not followed: a directory named without its slash is told by the
 * redirect that adds it, without asking that second URL too (its listing is what comes next).
 * Any other redirect (a file served from elsewhere) is followed from where it points. */
static int head_kind(const char *path) {
    remote_target t;
    ckpt_err err;
    if (target_of(path, &t, &err) != 0) return REMOTE_MISSING;
    char shown[2048], msg[512];
    http_shown(path, shown, sizeof shown);
    http_req rq = {.url = t.url.data, .shown = shown, .head = true, .no_follow = true};
    http_resp rs;
    int kind = REMOTE_MISSING;
    int rc = http_perform(&rq, &rs, msg, sizeof msg);
    if (rc == 0 && rs.status >= 300 && rs.status < 400 && rs.redirect_url) {
        if (redirect_adds_slash(t.url.data, rs.redirect_url)) {
            kind = REMOTE_DIR;
        } else {
            char *to = rs.redirect_url;
            rs.redirect_url = NULL;
            http_resp_free(&rs);
            http_req follow = {.url = to, .shown = shown, .head = true};
            rc = http_perform(&follow, &rs, msg, sizeof msg);
            if (rc == 0 && !rs.effective_url)
                rs.effective_url = to; /* where it ended is what tells a directory */
            else
                free(to);
        }
    }
    if (kind == REMOTE_MISSING && rc == 0 && rs.status == 200) {
        size_t n = strlen(t.url.data);
        const char *eff = rs.effective_url ? rs.effective_url : t.url.data;
        size_t en = strlen(eff);
        bool slash_end = (en && eff[en - 1] == '/') || (n && t.url.data[n - 1] == '/');
        bool html = strncmp(rs.content_type, "text/html", 9) == 0;
        kind = slash_end || html ? REMOTE_DIR : REMOTE_FILE;
    }
    http_resp_free(&rs);
    remote_target_free(&t);
    return kind;
}

/* What HEADs answered, by URL: index pages leave dot files out (nginx does), and the directory
 * probes ask for the same few names (.metadata, .hf_metadata/...) again and again. */
static pthread_mutex_t asked_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct asked {
    int kind;
    struct asked *next;
    char url[];
} asked;

static asked *asked_list;

int httpdir_kind(const char *url) {
    pthread_mutex_lock(&asked_lock);
    for (asked *a = asked_list; a; a = a->next)
        if (strcmp(a->url, url) == 0) {
            int k = a->kind;
            pthread_mutex_unlock(&asked_lock);
            return k;
        }
    pthread_mutex_unlock(&asked_lock);
    int k = head_kind(url);
    size_t n = strlen(url);
    asked *a = malloc(sizeof *a + n + 1);
    if (a) {
        a->kind = k;
        memcpy(a->url, url, n + 1);
        pthread_mutex_lock(&asked_lock);
        a->next = asked_list;
        asked_list = a;
        pthread_mutex_unlock(&asked_lock);
    }
    return k;
}

/* An href of an index page as an entry name: relative, one component, decoded. NULL if it is
 * a sort link, a parent link, absolute or elsewhere. */
static char *entry_name(const char *h, size_t n, bool *dir) {
    if (!n || h[0] == '?' || h[0] == '#' || h[0] == '/' || memmem(h, n, "://", 3)) return NULL;
    if (n >= 2 && h[0] == '.' && h[1] == '/') h += 2, n -= 2;
    *dir = n && h[n - 1] == '/';
    if (*dir) n--;
    char *out = malloc(n + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (h[i] == '%' && i + 2 < n && text_hex_digit(h[i + 1]) >= 0 &&
            text_hex_digit(h[i + 2]) >= 0) {
            out[o++] = (char)(text_hex_digit(h[i + 1]) * 16 + text_hex_digit(h[i + 2]));
            i += 2;
        } else if (h[i] == '&' && n - i >= 5 && memcmp(h + i, "&amp;", 5) == 0) {
            out[o++] = '&';
            i += 4;
        } else {
            out[o++] = h[i];
        }
    }
    out[o] = 0;
    if (!o || strchr(out, '/') || memchr(out, 0, o) != NULL || !strcmp(out, ".") ||
        !strcmp(out, "..") || strchr(out, '?')) {
        free(out);
        return NULL;
    }
    return out;
}

int httpdir_list(const char *dir, remote_entry **out, size_t *count, ckpt_err *err) {
    *out = NULL;
    *count = 0;
    remote_target t;
    int rc = target_of(dir, &t, err);
    if (rc) return rc;
    if (t.url.len == 0 || t.url.data[t.url.len - 1] != '/') sb_putc(&t.url, '/');
    char shown[2048], msg[512];
    http_shown(dir, shown, sizeof shown);
    strbuf body;
    sb_init(&body);
    http_req rq = {
        .url = t.url.data, .shown = shown, .body = &body, .body_cap = REMOTE_LIST_PAGE_BYTES};
    http_resp rs;
    rc = http_perform(&rq, &rs, msg, sizeof msg);
    if (rc)
        rc = ckpt_fail(err, rc, "%s", msg);
    else if (rs.status != 200)
        rc = ckpt_fail(err,
                       rs.status == 404   ? -ENOENT
                       : rs.status == 403 ? -EACCES
                                          : -EIO,
                       "%s/: HTTP %ld listing the directory", shown, rs.status);
    else if (rs.overflow || body.failed)
        rc = ckpt_fail(err, -EFBIG, "%s/: index page over %u MiB", shown,
                       REMOTE_LIST_PAGE_BYTES >> 20);
    http_resp_free(&rs);
    remote_target_free(&t);
    remote_listing l;
    remote_listing_init(&l, shown);
    if (!rc) rc = remote_budget_page(&l.budget, body.len, err);
    const char *p = body.data, *end = body.data ? body.data + body.len : NULL;
    while (!rc && p && p < end) {
        const char *h = memmem(p, (size_t)(end - p), "href=\"", 6);
        if (!h) break;
        h += 6;
        const char *q = memchr(h, '"', (size_t)(end - h));
        if (!q) break;
        p = q + 1;
        bool is_dir;
        char *name = entry_name(h, (size_t)(q - h), &is_dir);
        if (!name) continue;
        /* index pages round sizes: none is kept */
        rc = remote_listing_add(&l, name, strlen(name), is_dir, REMOTE_SIZE_UNKNOWN, err);
        free(name);
    }
    sb_free(&body);
    if (rc) {
        remote_listing_free(&l);
        return rc;
    }
    remote_listing_take(&l, out, count);
    return 0;
}
