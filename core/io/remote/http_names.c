/* http(s) names: user:password@ and ?query stay out of every shown name (messages, summaries,
 * sidecars), and the real URL is found again from the shown one when a request is made. */
#include "remote.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct secret {
    char *shown; /* redacted prefix */
    char *real;  /* the same prefix as given, without its query */
    char *query; /* "?..." of a file URL, or "" */
    struct secret *next;
} secret;

static pthread_mutex_t secrets_lock = PTHREAD_MUTEX_INITIALIZER;
static secret *secrets;

void http_shown(const char *path, char *out, size_t cap) {
    http_redact(path, out, cap);
    if (strcmp(out, path) == 0) return;
    /* Remember how to get back to the real name from the shown one. */
    secret *s = calloc(1, sizeof *s);
    size_t ql = strcspn(path, "?#");
    if (s) {
        s->shown = strdup(out);
        s->real = strndup(path, ql);
        s->query = strdup(path + ql);
    }
    if (!s || !s->shown || !s->real || !s->query) {
        if (s) free(s->shown), free(s->real), free(s->query);
        free(s);
        return;
    }
    pthread_mutex_lock(&secrets_lock);
    s->next = secrets;
    secrets = s;
    pthread_mutex_unlock(&secrets_lock);
}

/* The real URL of a shown name: its user:password@ and ?query put back. */
static void real_http_url(const char *path, strbuf *url) {
    pthread_mutex_lock(&secrets_lock);
    for (secret *s = secrets; s; s = s->next) {
        size_t n = strlen(s->shown);
        if (strncmp(path, s->shown, n) == 0 && (path[n] == 0 || path[n] == '/')) {
            sb_puts(url, s->real);
            sb_puts(url, path + n);
            if (path[n] == 0) sb_puts(url, s->query);
            pthread_mutex_unlock(&secrets_lock);
            return;
        }
    }
    pthread_mutex_unlock(&secrets_lock);
    sb_puts(url, path);
}

int http_target(const char *path, remote_target *t, ckpt_err *err) {
    (void)err;
    real_http_url(path, &t->url);
    return 0;
}
