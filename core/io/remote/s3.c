/* s3://bucket/key for S3-compatible stores: SigV4 by libcurl, path-style or virtual-hosted
 * addressing, directories as prefixes listed with ListObjectsV2 (every page). */
#include "listing.h"
#include "remote.h"
#include "../../util/err.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* sha256 of an empty body: what GETs sign as their payload. */
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

static pthread_mutex_t s3_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    bool ready;
    char endpoint[1024]; /* scheme://host[:port][/base], no trailing slash */
    char hint[300];      /* when the endpoint is AWS's by default: how to name another */
    char region[64];
    bool path_style;
    http_auth auth;
    bool signed_requests;
    char sigv4[128], userpwd[1100], token[4200], sha[128];
} s3;
static char *opt_endpoint, *opt_region, *opt_addressing;

void remote_set_s3_options(const ckpt_remote_options *o) {
    pthread_mutex_lock(&s3_lock);
    if (o->s3_endpoint) free(opt_endpoint), opt_endpoint = strdup(o->s3_endpoint);
    if (o->s3_region) free(opt_region), opt_region = strdup(o->s3_region);
    if (o->s3_addressing) free(opt_addressing), opt_addressing = strdup(o->s3_addressing);
    s3.ready = false;
    pthread_mutex_unlock(&s3_lock);
}

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* aws_access_key_id, aws_secret_access_key, aws_session_token of one profile of an INI file. */
static void read_credentials(const char *file, const char *profile, char *id, char *secret,
                             char *token, size_t cap) {
    FILE *f = fopen(file, "r");
    if (!f) return;
    char line[4096];
    bool in = false;
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        size_t n = strcspn(p, "\r\n");
        p[n] = 0;
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) p[--n] = 0;
        if (*p == '[') {
            char *end = strchr(p, ']');
            if (end) *end = 0;
            char *name = p + 1;
            while (*name == ' ') name++;
            if (!strncmp(name, "profile ", 8)) name += 8;
            in = strcmp(name, profile) == 0;
            continue;
        }
        if (!in || *p == '#' || *p == ';') continue;
        char *eq = strchr(p, '=');
        if (!eq) continue;
        char *k = p, *v = eq + 1;
        char *ke = eq;
        while (ke > k && (ke[-1] == ' ' || ke[-1] == '\t')) ke--;
        *ke = 0;
        while (*v == ' ' || *v == '\t') v++;
        if (!strcmp(k, "aws_access_key_id"))
            snprintf(id, cap, "%s", v);
        else if (!strcmp(k, "aws_secret_access_key"))
            snprintf(secret, cap, "%s", v);
        else if (!strcmp(k, "aws_session_token"))
            snprintf(token, cap, "%s", v);
    }
    fclose(f);
}

static void setup(void) {
    if (s3.ready) return;
    const char *region = opt_region                  ? opt_region
                         : env("AWS_REGION")         ? env("AWS_REGION")
                         : env("AWS_DEFAULT_REGION") ? env("AWS_DEFAULT_REGION")
                                                     : "us-east-1";
    snprintf(s3.region, sizeof s3.region, "%s", region);
    const char *ep = opt_endpoint                 ? opt_endpoint
                     : env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3")
                                                  : env("AWS_ENDPOINT_URL");
    if (ep)
        snprintf(s3.endpoint, sizeof s3.endpoint, "%s", ep);
    else
        snprintf(s3.endpoint, sizeof s3.endpoint, "https://s3.%s.amazonaws.com", s3.region);
    /* A MinIO or Ceph user who forgot the endpoint sees AWS's host fail: say how to name one. */
    if (ep)
        s3.hint[0] = '\0';
    else
        snprintf(s3.hint, sizeof s3.hint,
                 " (AWS S3's endpoint for region %s: for another S3 service set -o "
                 "s3_endpoint=URL or AWS_ENDPOINT_URL_S3)",
                 s3.region);
    size_t n = strlen(s3.endpoint);
    while (n && s3.endpoint[n - 1] == '/') s3.endpoint[--n] = 0;
    /* A custom endpoint (MinIO, s3rver, Ceph) is usually one host for every bucket. */
    s3.path_style = opt_addressing ? strcmp(opt_addressing, "path") == 0 : ep != NULL;
    char id[512] = "", secret[512] = "", token[4096] = "";
    if (env("AWS_ACCESS_KEY_ID") && env("AWS_SECRET_ACCESS_KEY")) {
        snprintf(id, sizeof id, "%s", env("AWS_ACCESS_KEY_ID"));
        snprintf(secret, sizeof secret, "%s", env("AWS_SECRET_ACCESS_KEY"));
        if (env("AWS_SESSION_TOKEN")) snprintf(token, sizeof token, "%s", env("AWS_SESSION_TOKEN"));
    } else {
        char path[1024];
        const char *file = env("AWS_SHARED_CREDENTIALS_FILE");
        if (!file && env("HOME")) {
            snprintf(path, sizeof path, "%s/.aws/credentials", env("HOME"));
            file = path;
        }
        const char *profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";
        if (file) read_credentials(file, profile, id, secret, token, sizeof id);
    }
    memset(&s3.auth, 0, sizeof s3.auth);
    s3.signed_requests = id[0] && secret[0];
    if (s3.signed_requests) {
        snprintf(s3.sigv4, sizeof s3.sigv4, "aws:amz:%s:s3", s3.region);
        snprintf(s3.userpwd, sizeof s3.userpwd, "%s:%s", id, secret);
        snprintf(s3.sha, sizeof s3.sha, "x-amz-content-sha256: %s", EMPTY_SHA256);
        s3.auth.sigv4 = s3.sigv4;
        s3.auth.userpwd = s3.userpwd;
        s3.auth.header1 = s3.sha;
        if (token[0]) {
            snprintf(s3.token, sizeof s3.token, "x-amz-security-token: %s", token);
            s3.auth.header2 = s3.token;
        }
    }
    s3.ready = true;
}

/* s3://BUCKET/KEY -> bucket and key (key may be empty). */
static int split(const char *path, char *bucket, size_t bcap, const char **key, ckpt_err *err) {
    const char *b = path + 5;
    size_t bl = strcspn(b, "/");
    if (bl == 0 || bl >= bcap) return ckpt_fail(err, -EINVAL, "%s: expected s3://BUCKET/KEY", path);
    memcpy(bucket, b, bl);
    bucket[bl] = 0;
    *key = b[bl] ? b + bl + 1 : b + bl;
    return 0;
}

/* The bucket's base URL (no trailing slash). */
static void bucket_url(strbuf *u, const char *bucket) {
    if (s3.path_style) {
        sb_puts(u, s3.endpoint);
        sb_putc(u, '/');
        sb_puts(u, bucket);
        return;
    }
    const char *host = strstr(s3.endpoint, "://");
    host = host ? host + 3 : s3.endpoint;
    sb_put(u, s3.endpoint, (size_t)(host - s3.endpoint));
    sb_puts(u, bucket);
    sb_putc(u, '.');
    sb_puts(u, host);
}

int s3_target(const char *path, remote_target *t, ckpt_err *err) {
    char bucket[256];
    const char *key;
    int rc = split(path, bucket, sizeof bucket, &key, err);
    if (rc) return rc;
    pthread_mutex_lock(&s3_lock);
    setup();
    bucket_url(&t->url, bucket);
    sb_putc(&t->url, '/');
    http_escape(&t->url, key, strlen(key), true);
    t->auth = s3.signed_requests ? &s3.auth : NULL;
    t->hint = s3.hint[0] ? s3.hint : NULL;
    pthread_mutex_unlock(&s3_lock);
    return 0;
}

/* Text of <tag>...</tag> from p (before end), XML entities decoded, into out. */
static const char *xml_text(const char *p, const char *end, const char *tag, strbuf *out) {
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = memmem(p, (size_t)(end - p), open, strlen(open));
    if (!a) return NULL;
    a += strlen(open);
    const char *b = memmem(a, (size_t)(end - a), close, strlen(close));
    if (!b) return NULL;
    sb_clear(out);
    for (const char *q = a; q < b; q++) {
        if (*q != '&') {
            sb_putc(out, *q);
            continue;
        }
        static const struct {
            const char *name;
            char c;
        } ents[] = {
            {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
        bool done = false;
        for (size_t i = 0; i < 5 && !done; i++) {
            size_t l = strlen(ents[i].name);
            if ((size_t)(b - q) >= l && !memcmp(q, ents[i].name, l)) {
                sb_putc(out, ents[i].c);
                q += l - 1;
                done = true;
            }
        }
        if (!done && q + 2 < b && q[1] == '#') {
            char *e;
            unsigned long c = q[2] == 'x' ? strtoul(q + 3, &e, 16) : strtoul(q + 2, &e, 10);
            if (*e == ';' && c > 0 && c < 128) {
                sb_putc(out, (char)c);
                q = e;
                done = true;
            }
        }
        if (!done) sb_putc(out, '&');
    }
    if (!out->data) sb_puts(out, "");
    return b + strlen(close);
}

/* One ListObjectsV2 page of the keys that start with `prefix` into body (max_keys 0: the
 * store's page size). 0, or a negative errno with the one-line reason. */
static int list_page(const char *shown, const char *bucket, const strbuf *prefix,
                     const strbuf *token, int max_keys, strbuf *url, strbuf *body, ckpt_err *err) {
    /* A one-key page only tells a kind, and the parent's listing can tell it too: asked once,
     * so a store that refuses such pages (s3rver: 500) costs no backoff. */
    bool once = max_keys == 1;
    sb_clear(url);
    pthread_mutex_lock(&s3_lock);
    setup();
    bucket_url(url, bucket);
    const http_auth *auth = s3.signed_requests ? &s3.auth : NULL;
    const char *hint = s3.hint[0] ? s3.hint : NULL;
    pthread_mutex_unlock(&s3_lock);
    /* Parameters in sorted order and fully escaped: the canonical query SigV4 signs. */
    sb_puts(url, "/?");
    if (token->len) {
        sb_puts(url, "continuation-token=");
        http_escape(url, token->data, token->len, false);
        sb_putc(url, '&');
    }
    sb_puts(url, "list-type=2&");
    if (max_keys) sb_printf(url, "max-keys=%d&", max_keys);
    sb_puts(url, "prefix=");
    http_escape(url, prefix->data, prefix->len, false);
    char msg[512];
    http_req rq = {.url = url->data,
                   .shown = shown,
                   .auth = auth,
                   .body = body,
                   .body_cap = REMOTE_LIST_PAGE_BYTES,
                   .once = once,
                   .hint = hint};
    http_resp rs;
    int rc = http_perform(&rq, &rs, msg, sizeof msg);
    if (rc) {
        rc = ckpt_fail(err, rc, "%s", msg);
    } else if (rs.status != 200) {
        /* A listing of a prefix without keys is an empty 200: a 404 is the bucket's. */
        strbuf code;
        sb_init(&code);
        bool coded =
            body->data && xml_text(body->data, body->data + body->len, "Code", &code) && code.data;
        bool no_bucket = rs.status == 404 && (!coded || strcmp(code.data, "NoSuchBucket") == 0);
        rc = ckpt_fail(err,
                       rs.status == 404   ? -ENOENT
                       : rs.status == 403 ? -EACCES
                                          : -EIO,
                       "%s: HTTP %ld listing the prefix%s%s%s%.*s%s", shown, rs.status,
                       rs.status == 403 ? " (access denied: check credentials)"
                       : no_bucket      ? ": no bucket "
                                        : "",
                       no_bucket ? bucket : "", coded ? " (" : "", coded ? SHOWN(code.len) : 0,
                       coded ? code.data : "", coded ? ")" : "");
        sb_free(&code);
    }
    http_resp_free(&rs);
    return rc;
}

int s3_kind(const char *path) {
    char bucket[256];
    const char *key;
    ckpt_err err;
    if (split(path, bucket, sizeof bucket, &key, &err)) return REMOTE_MISSING;
    if (!*key) return REMOTE_DIR;
    /* Two one-key pages instead of a listing of the parent, which for s3://BUCKET/NAME would be
     * every key of the bucket: a key below KEY/ makes a directory; KEY itself, which sorts
     * before every longer key that starts with it, a file. */
    strbuf prefix, url, body, token, text;
    sb_init(&prefix);
    sb_init(&url);
    sb_init(&body);
    sb_init(&token);
    sb_init(&text);
    int kind = REMOTE_MISSING;
    sb_puts(&prefix, key);
    sb_putc(&prefix, '/');
    if (list_page(path, bucket, &prefix, &token, 1, &url, &body, &err) != 0)
        kind = -1;
    else if (body.data && memmem(body.data, body.len, "<Contents>", 10))
        kind = REMOTE_DIR;
    sb_clear(&prefix);
    sb_puts(&prefix, key);
    sb_clear(&body);
    if (kind == REMOTE_MISSING) {
        if (list_page(path, bucket, &prefix, &token, 1, &url, &body, &err) != 0)
            kind = -1;
        else if (body.data && xml_text(body.data, body.data + body.len, "Key", &text) &&
                 text.data && strcmp(text.data, key) == 0)
            kind = REMOTE_FILE;
    }
    sb_free(&prefix);
    sb_free(&url);
    sb_free(&body);
    sb_free(&token);
    sb_free(&text);
    return kind;
}

int s3_list(const char *dir, remote_entry **out, size_t *count, ckpt_err *err) {
    *out = NULL;
    *count = 0;
    char bucket[256];
    const char *key;
    int rc = split(dir, bucket, sizeof bucket, &key, err);
    if (rc) return rc;
    strbuf prefix, url, body, text, token;
    sb_init(&prefix);
    sb_init(&url);
    sb_init(&body);
    sb_init(&text);
    sb_init(&token);
    sb_puts(&prefix, key);
    if (prefix.len && prefix.data[prefix.len - 1] != '/') sb_putc(&prefix, '/');
    if (!prefix.data) sb_puts(&prefix, "");
    remote_listing l;
    remote_listing_init(&l, dir);
    while (!rc) {
        if ((rc = list_page(dir, bucket, &prefix, &token, 0, &url, &body, err))) break;
        if ((rc = remote_budget_page(&l.budget, body.len, err))) break;
        const char *p = body.data ? body.data : "", *end = p + body.len;
        /* Every key below the prefix, without a delimiter: directories are the first names of
         * deeper keys (some stores leave a prefix holding only deeper keys out of a delimited
         * listing). */
        for (const char *c = p; !rc;) {
            const char *a = memmem(c, (size_t)(end - c), "<Contents>", 10);
            if (!a) break;
            const char *b = memmem(a, (size_t)(end - a), "</Contents>", 11);
            if (!b) break;
            uint64_t size = REMOTE_SIZE_UNKNOWN;
            if (xml_text(a, b, "Size", &text) && text.data && text.data[0] >= '0' &&
                text.data[0] <= '9') {
                char *num_end;
                unsigned long long v = strtoull(text.data, &num_end, 10);
                if (*num_end == '\0') size = v;
            }
            if (xml_text(a, b, "Key", &text) && text.len > prefix.len &&
                (!prefix.len || !memcmp(text.data, prefix.data, prefix.len))) {
                const char *name = text.data + prefix.len;
                size_t len = text.len - prefix.len;
                const char *slash = memchr(name, '/', len);
                size_t nl = slash ? (size_t)(slash - name) : len;
                rc = remote_listing_add(&l, name, nl, slash != NULL, size, err);
            }
            c = b + 11;
        }
        if (rc) break;
        bool truncated =
            xml_text(p, end, "IsTruncated", &text) && text.data && strcmp(text.data, "true") == 0;
        if (!truncated) break;
        if (!xml_text(p, end, "NextContinuationToken", &token) || !token.len) {
            rc = ckpt_fail(err, -EIO, "%s: truncated listing without a continuation token", dir);
            break;
        }
    }
    sb_free(&prefix);
    sb_free(&url);
    sb_free(&body);
    sb_free(&text);
    sb_free(&token);
    if (rc) {
        remote_listing_free(&l);
        return rc;
    }
    remote_listing_take(&l, out, count);
    return 0;
}
