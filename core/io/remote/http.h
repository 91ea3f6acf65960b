/* HTTP requests through libcurl for the remote sources: one shared connection cache (keep-alive
 * across requests and threads), retries with backoff for what a retry can fix (timeouts, resets,
 * 5xx), and the response headers the remote layer pins objects by. */
#ifndef CKPT_REMOTE_HTTP_H
#define CKPT_REMOTE_HTTP_H

#include "../../util/strbuf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* How requests to one kind of place authenticate. Secrets stay here and in libcurl's memory:
 * nothing in this struct is ever printed. */
typedef struct http_auth {
    const char *sigv4;   /* "aws:amz:REGION:s3" for S3, or NULL */
    const char *userpwd; /* "KEY_ID:SECRET" with sigv4 */
    const char *header1; /* e.g. "x-amz-security-token: ..." or "Authorization: Bearer ..." */
    const char *header2;
} http_auth;

typedef struct http_req {
    const char *url;       /* the URL to fetch (may hold secrets: never shown) */
    const char *shown;     /* the URL as messages show it */
    const http_auth *auth; /* NULL: anonymous */
    bool head;             /* HEAD instead of GET */
    bool ranged;           /* send Range: bytes=off-(off+len-1) */
    uint64_t off, len;
    void *buf;    /* ranged GET: the body goes here, at most len bytes */
    strbuf *body; /* otherwise the whole body, at most body_cap bytes */
    size_t body_cap;
    bool once;        /* no retries: a probe whose failure has a fallback */
    bool no_follow;   /* answer a redirect with its status and redirect_url, not its target */
    const char *hint; /* appended to a failure to reach the host (how to name another one) */
} http_req;

typedef struct http_resp {
    long status;
    uint64_t got;  /* body bytes received */
    bool overflow; /* the server sent more than asked for */
    char etag[160];
    char content_type[96];
    bool has_range; /* Content-Range: bytes START-END/TOTAL */
    uint64_t range_start, range_end, range_total;
    bool has_length;
    uint64_t length;     /* Content-Length */
    time_t mtime;        /* Last-Modified, 0 if none */
    char *effective_url; /* after redirects (malloc'd, NULL if same) */
    char *next_link;     /* Link: <...>; rel="next" (malloc'd) */
    char *redirect_url;  /* where a redirect not followed (no_follow) points (malloc'd) */
    int retries;
} http_resp;

typedef struct http_config {
    unsigned timeout;    /* seconds without progress before a request is given up */
    unsigned retries;    /* extra attempts for retryable failures */
    unsigned backoff_ms; /* first backoff, doubled per attempt (capped at 2 s) */
} http_config;

void http_set_config(const http_config *c);
/* Performs the request with retries. Returns 0 when a response arrived (any status: the caller
 * judges it), or a negative errno with msg filled ("URL: cause") when none did. */
int http_perform(const http_req *rq, http_resp *rs, char *msg, size_t msg_cap);
void http_resp_free(http_resp *rs);

/* Counters for .ckptfs/cache.json. */
typedef struct http_stats {
    uint64_t requests, retries, failures, bytes;
} http_stats;
void http_get_stats(http_stats *out);

/* The URL without user:password@ and without ?query or #fragment: what messages show. */
void http_redact(const char *url, char *out, size_t cap);
/* %XX-escapes everything but unreserved characters (and '/' when keep_slash). */
void http_escape(strbuf *sb, const char *s, size_t n, bool keep_slash);

#endif
