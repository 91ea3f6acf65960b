#include "http.h"

#include <curl/curl.h>
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CURLSH *share;
static pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
enum { POOL_MAX = 64 };
static CURL *pool[POOL_MAX];
static size_t pool_n;
/* The slowest transfer kept going (bytes a second over a `timeout` window): far below any
 * usable link, far above a server that drips to hold a connection. ckptfs(1) names it. */
#define HTTP_MIN_RATE 1024

static http_config config = {.timeout = 30, .retries = 5, .backoff_ms = 100};
static _Atomic uint64_t n_requests, n_retries, n_failures, n_bytes;

static void lock_share(CURL *h, curl_lock_data d, curl_lock_access a, void *u) {
    (void)h, (void)a, (void)u;
    pthread_mutex_lock(&share_locks[d]);
}

static void unlock_share(CURL *h, curl_lock_data d, void *u) {
    (void)h, (void)u;
    pthread_mutex_unlock(&share_locks[d]);
}

/* One connection cache for every handle: a block fetched by a prefetch thread reuses the
 * keep-alive connection a reader opened. */
static void init_curl(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_init(&share_locks[i], NULL);
    share = curl_share_init();
    if (!share) return;
    curl_share_setopt(share, CURLSHOPT_LOCKFUNC, lock_share);
    curl_share_setopt(share, CURLSHOPT_UNLOCKFUNC, unlock_share);
    curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
    curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
}

void http_set_config(const http_config *c) {
    config = *c;
    if (config.timeout == 0) config.timeout = 30;
    if (config.backoff_ms == 0) config.backoff_ms = 100;
}

static CURL *handle_get(void) {
    pthread_once(&init_once, init_curl);
    pthread_mutex_lock(&pool_lock);
    CURL *h = pool_n ? pool[--pool_n] : NULL;
    pthread_mutex_unlock(&pool_lock);
    if (h) {
        curl_easy_reset(h);
        return h;
    }
    return curl_easy_init();
}

static void handle_put(CURL *h) {
    pthread_mutex_lock(&pool_lock);
    if (pool_n < POOL_MAX) {
        pool[pool_n++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&pool_lock);
    if (h) curl_easy_cleanup(h);
}

typedef struct xfer {
    const http_req *rq;
    http_resp *rs;
} xfer;

static void copy_value(char *out, size_t cap, const char *v, size_t n) {
    while (n && (*v == ' ' || *v == '\t')) v++, n--;
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ')) n--;
    if (n >= cap) n = cap - 1;
    memcpy(out, v, n);
    out[n] = 0;
}

static bool header_is(const char *line, size_t n, const char *name, const char **value,
                      size_t *vlen) {
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) != 0 || line[k] != ':') return false;
    *value = line + k + 1;
    *vlen = n - k - 1;
    return true;
}

static void parse_content_range(http_resp *rs, const char *v) {
    unsigned long long a, b, t;
    while (*v == ' ') v++;
    if (sscanf(v, "bytes %llu-%llu/%llu", &a, &b, &t) == 3) {
        rs->has_range = true;
        rs->range_start = a;
        rs->range_end = b;
        rs->range_total = t;
    }
}

/* Link: <https://...>; rel="next" (the Hub's tree pages). */
static void parse_link(http_resp *rs, const char *v, size_t n) {
    const char *end = v + n;
    while (v < end) {
        const char *lt = memchr(v, '<', (size_t)(end - v));
        if (!lt) return;
        const char *gt = memchr(lt, '>', (size_t)(end - lt));
        if (!gt) return;
        const char *comma = memchr(gt, ',', (size_t)(end - gt));
        const char *stop = comma ? comma : end;
        const char *rel = gt;
        bool next = false;
        for (; rel + 10 <= stop; rel++)
            if (strncmp(rel, "rel=\"next\"", 10) == 0 || strncmp(rel, "rel=next", 8) == 0)
                next = true;
        if (next) {
            free(rs->next_link);
            rs->next_link = strndup(lt + 1, (size_t)(gt - lt - 1));
            return;
        }
        v = stop + (comma ? 1 : 0);
    }
}

static size_t on_header(char *p, size_t size, size_t nitems, void *ud) {
    xfer *x = ud;
    http_resp *rs = x->rs;
    size_t n = size * nitems;
    const char *v;
    size_t vl;
    char tmp[256];
    if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) {
        /* A new response (after a redirect or a 100): forget the previous one's headers. */
        char *keep_link = rs->next_link;
        rs->next_link = NULL;
        free(keep_link);
        rs->etag[0] = rs->content_type[0] = 0;
        rs->has_range = rs->has_length = false;
        rs->got = 0;
        rs->overflow = false;
        if (x->rq->body) sb_clear(x->rq->body);
    } else if (header_is(p, n, "etag", &v, &vl)) {
        copy_value(rs->etag, sizeof rs->etag, v, vl);
    } else if (header_is(p, n, "content-type", &v, &vl)) {
        copy_value(rs->content_type, sizeof rs->content_type, v, vl);
    } else if (header_is(p, n, "content-range", &v, &vl)) {
        copy_value(tmp, sizeof tmp, v, vl);
        parse_content_range(rs, tmp);
    } else if (header_is(p, n, "content-length", &v, &vl)) {
        copy_value(tmp, sizeof tmp, v, vl);
        char *e;
        unsigned long long l = strtoull(tmp, &e, 10);
        if (e != tmp && !*e) {
            rs->has_length = true;
            rs->length = l;
        }
    } else if (header_is(p, n, "link", &v, &vl)) {
        parse_link(rs, v, vl);
    }
    return n;
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *ud) {
    xfer *x = ud;
    size_t n = size * nmemb;
    const http_req *rq = x->rq;
    http_resp *rs = x->rs;
    if (rq->buf) {
        if (rs->got + n > rq->len) {
            /* A server that ignores Range sends the whole object: stop at once. */
            rs->overflow = true;
            return 0;
        }
        memcpy((char *)rq->buf + rs->got, p, n);
    } else if (rq->body) {
        if (rs->got + n > rq->body_cap) {
            rs->overflow = true;
            return 0;
        }
        sb_put(rq->body, p, n);
        if (rq->body->failed) return 0;
    }
    rs->got += n;
    return n;
}

static bool retryable_code(CURLcode c) {
    switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return true;
    default:
        return false;
    }
}

static bool retryable_status(long s) {
    return s == 408 || s == 429 || (s >= 500 && s <= 599);
}

/* scheme://host:port of a URL, lowercased, with the scheme's port when none is given: what
 * decides whether a redirect leaves the origin its credentials were meant for. */
static void origin_of(const char *url, char *out, size_t cap) {
    const char *sep = strstr(url, "://");
    if (!sep || !cap) {
        if (cap) out[0] = 0;
        return;
    }
    const char *host = sep + 3;
    size_t hl = strcspn(host, "/?#");
    const char *at = memchr(host, '@', hl);
    if (at) hl -= (size_t)(at + 1 - host), host = at + 1;
    const char *colon = host[0] == '[' ? memchr(host, ']', hl) : host;
    colon = colon ? memchr(colon, ':', hl - (size_t)(colon - host)) : NULL;
    size_t name_len = colon ? (size_t)(colon - host) : hl;
    bool tls = (size_t)(sep - url) == 5 && strncasecmp(url, "https", 5) == 0;
    const char *port = colon ? colon + 1 : tls ? "443" : "80";
    size_t port_len = colon ? hl - name_len - 1 : strlen(port);
    size_t o = 0;
    for (const char *p = url; p < sep && o + 1 < cap; p++) out[o++] = (char)tolower(*p);
    if (o + 1 < cap) out[o++] = '/';
    for (size_t i = 0; i < name_len && o + 1 < cap; i++) out[o++] = (char)tolower(host[i]);
    if (o + 1 < cap) out[o++] = ':';
    for (size_t i = 0; i < port_len && o + 1 < cap; i++) out[o++] = port[i];
    out[o] = 0;
}

static bool same_origin(const char *a, const char *b) {
    char oa[512], ob[512];
    origin_of(a, oa, sizeof oa);
    origin_of(b, ob, sizeof ob);
    return oa[0] && strcmp(oa, ob) == 0;
}

static bool redirect_status(long s) {
    return s == 301 || s == 302 || s == 303 || s == 307 || s == 308;
}

/* One request to url. follow: let libcurl follow redirects (anonymous requests only: it strips
 * Authorization on a cross-host redirect but not custom headers such as
 * x-amz-security-token, so authenticated requests follow them in http_perform). */
static CURLcode perform_once(CURL *h, const http_req *rq, const char *url, const http_auth *auth,
                             bool follow, http_resp *rs, struct curl_slist *hdrs) {
    xfer x = {rq, rs};
    char range[64];
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 8L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, (long)config.timeout);
    /* A stalled transfer is given up and retried, and so is one that drips: under
     * HTTP_MIN_RATE bytes a second on average over `timeout` seconds (a server sending 2 bytes
     * a second would otherwise hold a reader, and a block, for ever). */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, (long)HTTP_MIN_RATE);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)config.timeout);
    curl_easy_setopt(h, CURLOPT_FILETIME, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "ckptfs");
    if (share) curl_easy_setopt(h, CURLOPT_SHARE, share);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
    if (rq->head) curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    if (rq->ranged) {
        snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)rq->off,
                 (unsigned long long)(rq->off + rq->len - 1));
        curl_easy_setopt(h, CURLOPT_RANGE, range);
        /* A block is megabytes: fewer, larger reads from the socket and callbacks than the
         * default 16 KiB. libcurl allocates this buffer for every transfer and frees it after:
         * at 64 KiB it comes from the heap and its pages are reused; at 128 KiB or more (the
         * daemon's mmap threshold, fs/common/heap.c) it would be a fresh mapping each time, a page
         * fault per 4 KiB received (a 512 KiB buffer cost 30,000 faults per GiB read). */
        if (rq->len >= (1u << 20)) curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 64L << 10);
    }
    if (hdrs) curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    if (auth && auth->sigv4) {
        curl_easy_setopt(h, CURLOPT_AWS_SIGV4, auth->sigv4);
        curl_easy_setopt(h, CURLOPT_USERPWD, auth->userpwd);
    }
    CURLcode c = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &rs->status);
    long ft = -1;
    if (curl_easy_getinfo(h, CURLINFO_FILETIME, &ft) == CURLE_OK && ft > 0) rs->mtime = ft;
    char *eff = NULL;
    free(rs->effective_url);
    rs->effective_url = NULL;
    if (curl_easy_getinfo(h, CURLINFO_EFFECTIVE_URL, &eff) == CURLE_OK && eff &&
        strcmp(eff, rq->url) != 0)
        rs->effective_url = strdup(eff);
    char *to = NULL;
    free(rs->redirect_url);
    rs->redirect_url = NULL;
    if (!follow && curl_easy_getinfo(h, CURLINFO_REDIRECT_URL, &to) == CURLE_OK && to)
        rs->redirect_url = strdup(to);
    return c;
}

bool http_auth_has_secret(const http_auth *a) {
    return a && (a->sigv4 || a->userpwd || a->header1 || a->header2);
}

/* An authenticated request, its redirects followed here: within the origin with the
 * credentials, and from the first hop that leaves it on without any (as libcurl does for
 * Authorization and a user:password, and for every header that carries a secret). */
static CURLcode perform_followed(CURL *h, const http_req *rq, http_resp *rs,
                                 struct curl_slist *auth_hdrs, struct curl_slist *plain_hdrs) {
    enum { MAX_HOPS = 8 };
    char *url = strdup(rq->url);
    if (!url) return CURLE_OUT_OF_MEMORY;
    const http_auth *auth = rq->auth;
    CURLcode c = CURLE_OK;
    for (int hop = 0;; hop++) {
        c = perform_once(h, rq, url, auth, false, rs, auth ? auth_hdrs : plain_hdrs);
        /* A redirect's own body may be longer than the block asked for. */
        if (c == CURLE_WRITE_ERROR && rs->overflow && redirect_status(rs->status)) c = CURLE_OK;
        if (c != CURLE_OK || rq->no_follow || !redirect_status(rs->status) || !rs->redirect_url)
            break;
        if (hop == MAX_HOPS) {
            c = CURLE_TOO_MANY_REDIRECTS;
            break;
        }
        char *next = rs->redirect_url;
        rs->redirect_url = NULL;
        if (!same_origin(next, rq->url)) auth = NULL; /* and stays off for later hops */
        free(url);
        url = next;
        rs->got = 0;
        rs->overflow = false;
    }
    if (!rq->no_follow) {
        free(rs->effective_url);
        rs->effective_url = strcmp(url, rq->url) != 0 ? strdup(url) : NULL;
    }
    free(url);
    return c;
}

/* The host[:port] of scheme://[user@]host[:port]/... (never the path or query, which may hold
 * secrets), for messages about a host that cannot be reached. */
static void url_host(const char *url, char *out, size_t cap) {
    const char *h = strstr(url, "://");
    h = h ? h + 3 : url;
    size_t n = strcspn(h, "/?#");
    const char *at = memchr(h, '@', n);
    if (at) {
        n -= (size_t)(at + 1 - h);
        h = at + 1;
    }
    snprintf(out, cap, "%.*s", (int)(n > 200 ? 200 : n), h);
}

int http_perform(const http_req *rq, http_resp *rs, char *msg, size_t msg_cap) {
    memset(rs, 0, sizeof *rs);
    CURL *h = handle_get();
    if (!h) {
        snprintf(msg, msg_cap, "%s: cannot start a request (libcurl)", rq->shown);
        return -ENOMEM;
    }
    /* Bytes as stored: a compressed transfer would shift every offset. */
    struct curl_slist *plain = curl_slist_append(NULL, "Accept-Encoding: identity");
    struct curl_slist *hdrs = curl_slist_append(NULL, "Accept-Encoding: identity");
    if (rq->auth && rq->auth->header1) hdrs = curl_slist_append(hdrs, rq->auth->header1);
    if (rq->auth && rq->auth->header2) hdrs = curl_slist_append(hdrs, rq->auth->header2);
    int rc = 0;
    unsigned delay = config.backoff_ms;
    for (unsigned attempt = 0;; attempt++) {
        atomic_fetch_add(&n_requests, 1);
        if (rq->body) sb_clear(rq->body);
        char *link = rs->next_link, *eff = rs->effective_url, *to = rs->redirect_url;
        memset(rs, 0, sizeof *rs);
        free(link);
        free(eff);
        free(to);
        rs->retries = (int)attempt;
        CURLcode c = http_auth_has_secret(rq->auth)
                         ? perform_followed(h, rq, rs, hdrs, plain)
                         : perform_once(h, rq, rq->url, NULL, !rq->no_follow, rs, plain);
        atomic_fetch_add(&n_bytes, rs->got);
        if (c == CURLE_WRITE_ERROR && rs->overflow) c = CURLE_OK; /* judged by the caller */
        bool again = c == CURLE_OK ? retryable_status(rs->status) : retryable_code(c);
        if (!again || attempt >= config.retries || rq->once) {
            if (c != CURLE_OK) {
                atomic_fetch_add(&n_failures, 1);
                char host[256] = "";
                if (c == CURLE_COULDNT_RESOLVE_HOST || c == CURLE_COULDNT_CONNECT)
                    url_host(rq->url, host, sizeof host);
                snprintf(msg, msg_cap, "%s: %s%s%s%s%s", rq->shown, curl_easy_strerror(c),
                         host[0] ? " " : "", host, attempt ? " (after retries)" : "",
                         rq->hint && host[0] ? rq->hint : "");
                rc = c == CURLE_OPERATION_TIMEDOUT                                   ? -ETIMEDOUT
                     : c == CURLE_COULDNT_CONNECT || c == CURLE_COULDNT_RESOLVE_HOST ? -EHOSTUNREACH
                     : c == CURLE_OUT_OF_MEMORY                                      ? -ENOMEM
                                                                                     : -EIO;
            }
            break;
        }
        atomic_fetch_add(&n_retries, 1);
        usleep(delay * 1000u);
        delay = delay * 2 > 2000 ? 2000 : delay * 2;
    }
    curl_slist_free_all(hdrs);
    curl_slist_free_all(plain);
    handle_put(h);
    return rc;
}

void http_resp_free(http_resp *rs) {
    free(rs->effective_url);
    free(rs->next_link);
    free(rs->redirect_url);
    rs->effective_url = rs->next_link = rs->redirect_url = NULL;
}

void http_get_stats(http_stats *out) {
    out->requests = atomic_load(&n_requests);
    out->retries = atomic_load(&n_retries);
    out->failures = atomic_load(&n_failures);
    out->bytes = atomic_load(&n_bytes);
}

void http_redact(const char *url, char *out, size_t cap) {
    if (!cap) return;
    size_t o = 0;
    const char *p = url;
    const char *scheme = strstr(url, "://");
    if (scheme) {
        size_t k = (size_t)(scheme - url) + 3;
        const char *host = url + k;
        size_t hl = strcspn(host, "/?#");
        const char *at = memchr(host, '@', hl);
        for (size_t i = 0; i < k && o + 1 < cap; i++) out[o++] = url[i];
        p = at ? at + 1 : host;
    }
    for (; *p && *p != '?' && *p != '#' && o + 1 < cap; p++) out[o++] = *p;
    out[o] = 0;
}

void http_escape(strbuf *sb, const char *s, size_t n, bool keep_slash) {
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
            sb_putc(sb, (char)c);
        } else {
            sb_putc(sb, '%');
            sb_putc(sb, hex[c >> 4]);
            sb_putc(sb, hex[c & 15]);
        }
    }
}
