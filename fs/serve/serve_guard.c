/* See serve_guard.h. Each connection has a record (its socket context) in one list, oldest
 * first by when it started waiting. A thread of the guard's own looks at the list four times
 * a second and shuts down the sockets of connections waiting past their time; libmicrohttpd
 * then sees the socket end and closes the connection itself. The records are removed under
 * the lock in the CLOSED notification, which the library sends before it closes the socket,
 * so a shutdown() never reaches a descriptor that has been reused. */
#include "serve_guard.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

typedef struct conn_rec {
    serve_guard *g;
    int fd;
    bool waiting;
    bool cut; /* shut down already */
    double since;
    struct conn_rec *prev, *next; /* in the waiting list, oldest first */
} conn_rec;

struct serve_guard {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    bool stopping;
    unsigned max_waiting, seconds, nwaiting;
    conn_rec *head, *tail;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void unlink_rec(serve_guard *g, conn_rec *r) {
    if (!r->waiting) return;
    if (r->prev)
        r->prev->next = r->next;
    else
        g->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        g->tail = r->prev;
    r->prev = r->next = NULL;
    r->waiting = false;
    g->nwaiting--;
}

static void start_waiting(serve_guard *g, conn_rec *r) {
    unlink_rec(g, r);
    r->waiting = true;
    r->since = now_s();
    r->prev = g->tail;
    if (g->tail)
        g->tail->next = r;
    else
        g->head = r;
    g->tail = r;
    g->nwaiting++;
}

/* Under the lock. The connection is not closed here: its socket ends, the library notices. */
static void cut(serve_guard *g, conn_rec *r) {
    unlink_rec(g, r);
    if (!r->cut && r->fd >= 0) shutdown(r->fd, SHUT_RDWR);
    r->cut = true;
}

static void *watch(void *arg) {
    serve_guard *g = arg;
    pthread_mutex_lock(&g->lock);
    while (!g->stopping) {
        double t = now_s();
        while (g->head && t - g->head->since > (double)g->seconds) cut(g, g->head);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&g->wake, &g->lock, &until);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

serve_guard *serve_guard_start(unsigned max_waiting, unsigned header_seconds) {
    serve_guard *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->max_waiting = max_waiting ? max_waiting : 1;
    g->seconds = header_seconds;
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->wake, NULL);
    if (pthread_create(&g->thread, NULL, watch, g) != 0) {
        pthread_cond_destroy(&g->wake);
        pthread_mutex_destroy(&g->lock);
        free(g);
        return NULL;
    }
    return g;
}

void serve_guard_stop(serve_guard *g) {
    if (!g) return;
    pthread_mutex_lock(&g->lock);
    g->stopping = true;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lock);
    pthread_join(g->thread, NULL);
    pthread_cond_destroy(&g->wake);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

void serve_guard_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                            enum MHD_ConnectionNotificationCode toe) {
    serve_guard *g = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_rec *r = calloc(1, sizeof *r);
        *socket_context = r;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!r) {
            /* No record, no bound: refuse the connection rather than serve it unguarded. */
            if (ci) shutdown(ci->connect_fd, SHUT_RDWR);
            return;
        }
        r->g = g;
        r->fd = ci ? ci->connect_fd : -1;
        pthread_mutex_lock(&g->lock);
        /* The newest waits; the one waiting longest makes room (a dripping client is old, a
         * client that sends its request at once is not). */
        while (g->nwaiting >= g->max_waiting && g->head) cut(g, g->head);
        start_waiting(g, r);
        pthread_mutex_unlock(&g->lock);
        return;
    }
    conn_rec *r = *socket_context;
    if (!r) return;
    pthread_mutex_lock(&g->lock);
    unlink_rec(g, r);
    pthread_mutex_unlock(&g->lock);
    free(r);
    *socket_context = NULL;
}

static conn_rec *rec_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void serve_guard_request(struct MHD_Connection *c) {
    conn_rec *r = rec_of(c);
    if (!r) return;
    pthread_mutex_lock(&r->g->lock);
    unlink_rec(r->g, r);
    pthread_mutex_unlock(&r->g->lock);
}

void serve_guard_completed(struct MHD_Connection *c) {
    conn_rec *r = rec_of(c);
    if (!r) return;
    pthread_mutex_lock(&r->g->lock);
    if (!r->cut) start_waiting(r->g, r);
    pthread_mutex_unlock(&r->g->lock);
}
