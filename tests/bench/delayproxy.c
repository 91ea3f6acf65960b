/* A TCP proxy on loopback that adds a fixed delay in each direction (these kernels have no
 * sch_netem): every chunk read from one side is written to the other ONE_WAY_MS after it was
 * read, so a request/answer round trip takes 2 * ONE_WAY_MS more, while throughput is kept
 * (chunks in flight are not serialised behind the delay).
 *
 * A user-space proxy delays data but not TCP's acknowledgements (the kernel sends those at
 * once), so without more a single connection would move as much per second as with no delay.
 * On a real path a connection has at most its window in flight per round trip: each direction
 * here holds at most WINDOW/2 bytes in its delay queue (its reader waits), which caps a
 * connection at WINDOW per RTT as the path would. WINDOW defaults to the smaller of the
 * kernel's tcp_rmem and tcp_wmem maxima (what autotuning lets a connection grow to).
 *
 * usage: delayproxy UPSTREAM_PORT ONE_WAY_MS [WINDOW_BYTES]
 * Prints "port P" (where it listens on 127.0.0.1), "window_bytes W", then "rtt_ms R": the
 * median of 9 one-byte
 * round trips through a second listener of the same relay to an echo socket of its own, i.e.
 * the RTT this proxy gives. Then relays until killed. Threads: per connection one reader and
 * one writer per direction; a direction holds at most QUEUE_CAP bytes (then its reader waits,
 * so TCP back-pressure still reaches the sender). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { CHUNK = 256 << 10, QUEUE_CAP = 64 << 20 };

static uint64_t delay_ns;
static size_t queue_cap = QUEUE_CAP; /* bytes one direction holds while delaying them */

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

typedef struct chunk {
    uint64_t due;
    size_t len; /* 0: the reader saw the end */
    struct chunk *next;
    char data[];
} chunk;

/* One direction of one connection: `from` is read, `to` written. */
typedef struct pipe_dir {
    int from, to;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    chunk *head, *tail;
    size_t queued;
    struct conn *conn;
} pipe_dir;

typedef struct conn {
    pipe_dir dir[2];
    int refs; /* threads still running (4) */
    pthread_mutex_t lock;
} conn;

static void conn_release(conn *c) {
    pthread_mutex_lock(&c->lock);
    int left = --c->refs;
    pthread_mutex_unlock(&c->lock);
    if (left) return;
    close(c->dir[0].from);
    close(c->dir[0].to);
    for (int i = 0; i < 2; i++) {
        for (chunk *k = c->dir[i].head, *n; k; k = n) {
            n = k->next;
            free(k);
        }
        pthread_mutex_destroy(&c->dir[i].lock);
        pthread_cond_destroy(&c->dir[i].cond);
    }
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static void push(pipe_dir *d, chunk *k) {
    pthread_mutex_lock(&d->lock);
    while (d->queued && d->queued + k->len > queue_cap) pthread_cond_wait(&d->cond, &d->lock);
    k->next = NULL;
    if (d->tail)
        d->tail->next = k;
    else
        d->head = k;
    d->tail = k;
    d->queued += k->len;
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

static void *reader(void *arg) {
    pipe_dir *d = arg;
    for (;;) {
        chunk *k = malloc(sizeof *k + CHUNK);
        if (!k) break;
        ssize_t n = recv(d->from, k->data, CHUNK, 0);
        if (n < 0 && errno == EINTR) {
            free(k);
            continue;
        }
        k->due = now_ns() + delay_ns;
        k->len = n > 0 ? (size_t)n : 0;
        if (n > 0 && (size_t)n < CHUNK / 4) {
            /* Small chunks (requests, headers) need not hold 256 KiB each while queued. */
            chunk *s = realloc(k, sizeof *k + (size_t)n);
            if (s) k = s;
        }
        push(d, k);
        if (n <= 0) break;
    }
    conn_release(d->conn);
    return NULL;
}

static void *writer(void *arg) {
    pipe_dir *d = arg;
    bool open_ = true;
    for (;;) {
        pthread_mutex_lock(&d->lock);
        while (!d->head) pthread_cond_wait(&d->cond, &d->lock);
        chunk *k = d->head;
        pthread_mutex_unlock(&d->lock);
        uint64_t t = now_ns();
        if (k->due > t) {
            struct timespec ts = {(time_t)((k->due - t) / 1000000000ull),
                                  (long)((k->due - t) % 1000000000ull)};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
            }
        }
        size_t put = 0;
        while (open_ && put < k->len) {
            ssize_t w = send(d->to, k->data + put, k->len - put, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                open_ = false;
                /* The other side is gone: make its reader see the end too. */
                shutdown(d->from, SHUT_RD);
                break;
            }
            put += (size_t)w;
        }
        bool end = k->len == 0;
        pthread_mutex_lock(&d->lock);
        d->head = k->next;
        if (!d->head) d->tail = NULL;
        d->queued -= k->len;
        pthread_cond_broadcast(&d->cond);
        pthread_mutex_unlock(&d->lock);
        free(k);
        if (end) {
            shutdown(d->to, SHUT_WR);
            break;
        }
    }
    conn_release(d->conn);
    return NULL;
}

static int connect_port(int port) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        close(s);
        return -1;
    }
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s;
}

static int listen_any(int *port) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 256) != 0 ||
        getsockname(s, (struct sockaddr *)&a, &al) != 0) {
        close(s);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return s;
}

static void start(pthread_t *t, void *(*fn)(void *), void *arg) {
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 256 << 10);
    if (pthread_create(t, &at, fn, arg) != 0) {
        perror("delayproxy: pthread_create");
        exit(1);
    }
    pthread_attr_destroy(&at);
}

typedef struct listener {
    int fd, upstream;
} listener;

static void *accept_loop(void *arg) {
    listener *l = arg;
    for (;;) {
        int c = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE) continue;
            break;
        }
        int one = 1;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int u = connect_port(l->upstream);
        if (u < 0) {
            close(c);
            continue;
        }
        conn *k = calloc(1, sizeof *k);
        if (!k) {
            close(c);
            close(u);
            continue;
        }
        k->refs = 4;
        pthread_mutex_init(&k->lock, NULL);
        k->dir[0] = (pipe_dir){.from = c, .to = u, .conn = k};
        k->dir[1] = (pipe_dir){.from = u, .to = c, .conn = k};
        pthread_t t;
        for (int i = 0; i < 2; i++) {
            pthread_mutex_init(&k->dir[i].lock, NULL);
            pthread_cond_init(&k->dir[i].cond, NULL);
        }
        for (int i = 0; i < 2; i++) {
            start(&t, reader, &k->dir[i]);
            start(&t, writer, &k->dir[i]);
        }
    }
    return NULL;
}

/* The echo end of the RTT self-test. */
static void *echo_loop(void *arg) {
    int l = *(int *)arg;
    int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    char b[64];
    ssize_t n;
    while (c >= 0 && (n = recv(c, b, sizeof b, 0)) > 0)
        if (send(c, b, (size_t)n, MSG_NOSIGNAL) != n) break;
    if (c >= 0) close(c);
    return NULL;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double measure_rtt_ms(void) {
    int echo_port, test_port;
    static int echo_fd;
    echo_fd = listen_any(&echo_port);
    static listener test;
    test.fd = listen_any(&test_port);
    test.upstream = echo_port;
    if (echo_fd < 0 || test.fd < 0) return -1;
    pthread_t t;
    start(&t, echo_loop, &echo_fd);
    start(&t, accept_loop, &test);
    int s = connect_port(test_port);
    if (s < 0) return -1;
    double ms[9];
    int n = 0;
    for (int i = 0; i < 10; i++) {
        char b = 'x';
        uint64_t t0 = now_ns();
        if (send(s, &b, 1, MSG_NOSIGNAL) != 1 || recv(s, &b, 1, MSG_WAITALL) != 1) break;
        if (i) ms[n++] = (double)(now_ns() - t0) / 1e6; /* the first pays for the connect */
    }
    close(s);
    if (!n) return -1;
    qsort(ms, (size_t)n, sizeof ms[0], by_value);
    return ms[n / 2];
}

/* The third number of /proc/sys/net/ipv4/NAME (the autotuning maximum), or 0. */
static size_t sysctl_max(const char *name) {
    char path[128];
    snprintf(path, sizeof path, "/proc/sys/net/ipv4/%s", name);
    FILE *f = fopen(path, "r");
    unsigned long long a = 0, b = 0, c = 0;
    if (f) {
        if (fscanf(f, "%llu %llu %llu", &a, &b, &c) != 3) c = 0;
        fclose(f);
    }
    return (size_t)c;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: delayproxy UPSTREAM_PORT ONE_WAY_MS [WINDOW_BYTES]\n");
        return 2;
    }
    int up = atoi(argv[1]);
    double ms = atof(argv[2]);
    if (up <= 0 || up > 65535 || ms < 0 || ms > 10000) {
        fprintf(stderr, "delayproxy: bad port or delay\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    delay_ns = (uint64_t)(ms * 1e6);
    size_t window = argc == 4 ? (size_t)strtoull(argv[3], NULL, 10) : 0;
    if (!window) {
        size_t r = sysctl_max("tcp_rmem"), w = sysctl_max("tcp_wmem");
        window = r && w ? (r < w ? r : w) : 4u << 20;
    }
    if (window < 2 * CHUNK) window = 2 * CHUNK;
    if (delay_ns && window / 2 < queue_cap) queue_cap = window / 2;
    static listener main_l;
    int port;
    main_l.fd = listen_any(&port);
    main_l.upstream = up;
    if (main_l.fd < 0) {
        perror("delayproxy: listen");
        return 1;
    }
    printf("port %d\nwindow_bytes %zu\n", port, delay_ns ? window : 0);
    printf("rtt_ms %.3f\n", measure_rtt_ms());
    fflush(stdout);
    accept_loop(&main_l);
    return 0;
}
