/* What a remote name shows (no secrets: user:password@ and ?query of http(s) names stay out of
 * every shown name) and what it requests (the real URL, or an s3:// / hf:// name's signed
 * target). */
#include "remote.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- secrets of http(s) names: user:password@ and ?query stay out of every shown name ---- */

typedef struct secret {
    char *shown; /* redacted prefix */
    char *real;  /* the same prefix as given, without its query */
    char *query; /* "?..." of a file URL, or "" */
    struct secret *next;
} secret;

static pthread_mutex_t secrets_lock = PTHREAD_MUTEX_INITIALIZER;
static secret *secrets;

void remote_shown(const char *path, char *out, size_t cap) {
    if (strncmp(path, "http://", 7) == 0 || strncmp(path, "https://", 8) == 0) {
        http_redact(path, out, cap);
        if (strcmp(out, path) != 0) {
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
        return;
    }
    snprintf(out, cap, "%s", path);
}

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

int remote_target_of(const char *path, remote_target *t, ckpt_err *err) {
    sb_init(&t->url);
    t->auth = NULL;
    t->hint = NULL;
    int rc = 0;
    if (strncmp(path, "s3://", 5) == 0)
        rc = s3_target(path, t, err);
    else if (strncmp(path, "hf://", 5) == 0)
        rc = hf_target(path, t, err);
    else
        real_http_url(path, &t->url);
    if (!rc && t->url.failed) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    if (rc) sb_free(&t->url);
    return rc;
}

void remote_target_free(remote_target *t) {
    sb_free(&t->url);
}
