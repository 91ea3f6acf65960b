#include "loop.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

uint64_t loop_metadata_ops(void) {
    static const uint32_t ops[] = {FUSE_LOOKUP,  FUSE_FORGET,  FUSE_BATCH_FORGET, FUSE_GETATTR,
                                   FUSE_OPENDIR, FUSE_READDIR, FUSE_READDIRPLUS,  FUSE_RELEASEDIR,
                                   FUSE_ACCESS,  FUSE_STATFS,  FUSE_INTERRUPT,    FUSE_INIT};
    uint64_t mask = 0;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) mask |= UINT64_C(1) << ops[i];
    return mask;
}

typedef struct loop {
    struct fuse_session *se;
    int fd;      /* the session's device, nonblocking while we serve */
    int stop_fd; /* an eventfd, readable once the loop is to end: wakes the sleepers */
    uint64_t spin_ns, inline_ops;
    unsigned max_threads;
    atomic_bool stop;
    pthread_mutex_t lock; /* guards what follows */
    pthread_cond_t seat_free;
    bool seat_taken;
    unsigned idle; /* threads waiting for the seat */
    unsigned started;
    pthread_t *tids;
    int error; /* the first receive error */
    /* The seat holder's own, passed on with the seat (under lock): the last request came
     * within the spin window of the wait's start, so the next one likely will too; and no
     * spinning before calm_after, set when a yield showed other work waiting for this CPU. */
    bool hot;
    uint64_t calm_after;
} loop;

/* Two asks of a spin this far apart mean someone else ran in between (our yield or a
 * preemption): the CPU is contended, and a spinner waits behind the others for its turn where
 * a sleeper is woken with priority (measured under load: spinning 12.3 s, sleeping 8.0 s for
 * the same walk). Spinning then stops for CONTENDED_PAUSE_NS. */
enum { OTHERS_RAN_NS = 50000, CONTENDED_PAUSE_NS = 50000000 };

/* libfuse's handlers (fuse_set_signal_handlers) end the session on these. */
static void exit_signals(sigset_t *s) {
    sigemptyset(s);
    sigaddset(s, SIGHUP);
    sigaddset(s, SIGINT);
    sigaddset(s, SIGTERM);
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static bool ending(loop *l) {
    return atomic_load_explicit(&l->stop, memory_order_relaxed) || fuse_session_exited(l->se);
}

static void stop_all(loop *l, int error) {
    pthread_mutex_lock(&l->lock);
    if (!l->error && error < 0) l->error = error;
    atomic_store(&l->stop, true);
    pthread_cond_broadcast(&l->seat_free);
    pthread_mutex_unlock(&l->lock);
    uint64_t one = 1;
    ssize_t w = write(l->stop_fd, &one, sizeof one);
    (void)w; /* an eventfd counter cannot overflow from a few writes */
}

/* Sleeps until one of p is ready. A thread that takes the exit signals (`signals`) takes them
 * only inside ppoll, so one that comes just before cannot be slept through. */
static void sleep_on(loop *l, struct pollfd *p, nfds_t n, bool signals) {
    sigset_t exits, old;
    if (signals) {
        exit_signals(&exits);
        pthread_sigmask(SIG_BLOCK, &exits, &old);
    }
    if (!ending(l)) ppoll(p, n, NULL, signals ? &old : NULL);
    if (signals) pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* The next request into buf, by the seat holder: > 0 its size, 0 when the loop ends, or a
 * negative errno. While requests come quickly it keeps asking for up to spin_ns (each ask is
 * a nonblocking read that answers EAGAIN), so the kernel has nobody to wake; otherwise it
 * sleeps in poll at once. */
static int receive(loop *l, struct fuse_buf *buf, bool signals) {
    uint64_t start = now_ns();
    uint64_t last = start;
    bool spin = l->hot && start >= l->calm_after;
    for (;;) {
        if (ending(l)) return 0;
        int r = fuse_session_receive_buf(l->se, buf);
        if (r > 0) {
            l->hot = now_ns() - start <= l->spin_ns;
            return r;
        }
        if (r == 0) return 0; /* unmounted (ENODEV): libfuse ended the session */
        if (r == -EINTR) continue;
        if (r != -EAGAIN) return r;
        uint64_t now = now_ns();
        if (spin && now - last > OTHERS_RAN_NS) {
            l->calm_after = now + CONTENDED_PAUSE_NS;
            spin = false;
        }
        last = now;
        if (spin && now - start < l->spin_ns) {
            sched_yield(); /* polite: whatever else is runnable here goes first */
            continue;
        }
        spin = false;
        struct pollfd p[2] = {{.fd = l->fd, .events = POLLIN},
                              {.fd = l->stop_fd, .events = POLLIN}};
        sleep_on(l, p, 2, signals);
    }
}

static bool answers_inline(const loop *l, const struct fuse_buf *buf) {
    if (l->max_threads <= 1) return true;
    if (buf->flags & FUSE_BUF_IS_FD) return false; /* a spliced WRITE */
    uint32_t op = ((const struct fuse_in_header *)buf->mem)->opcode;
    return op < 64 && (l->inline_ops >> op & 1);
}

static void *serve_thread(void *arg);

/* Under l->lock. Threads start with every signal blocked: the exit signals go to the thread
 * that waits for them. */
static void start_thread(loop *l) {
    if (l->started >= l->max_threads || atomic_load(&l->stop)) return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    if (pthread_create(&l->tids[l->started], NULL, serve_thread, l) == 0) l->started++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Every thread: wait for the seat, then receive; answer a request that never blocks while
 * keeping the seat, and give the seat up before any other, so that the next request is read
 * while this one is answered. */
static void serve(loop *l, bool signals) {
    struct fuse_buf buf = {.mem = NULL};
    bool seated = false;
    for (;;) {
        if (!seated) {
            pthread_mutex_lock(&l->lock);
            l->idle++;
            while (l->seat_taken && !atomic_load(&l->stop))
                pthread_cond_wait(&l->seat_free, &l->lock);
            l->idle--;
            bool stop = atomic_load(&l->stop);
            if (!stop) l->seat_taken = seated = true;
            pthread_mutex_unlock(&l->lock);
            if (stop) break;
        }
        int r = receive(l, &buf, signals);
        if (r <= 0) {
            stop_all(l, r);
            break;
        }
        if (!answers_inline(l, &buf)) {
            pthread_mutex_lock(&l->lock);
            l->seat_taken = seated = false;
            if (l->idle)
                pthread_cond_signal(&l->seat_free);
            else
                start_thread(l);
            pthread_mutex_unlock(&l->lock);
        }
        fuse_session_process_buf(l->se, &buf);
    }
    free(buf.mem);
}

static void *serve_thread(void *arg) {
    serve(arg, false);
    return NULL;
}

int loop_serve(struct fuse_session *se, const loop_opts *o) {
    loop l = {.se = se,
              .fd = fuse_session_fd(se),
              .spin_ns = (uint64_t)o->spin_us * 1000u,
              .inline_ops = o->inline_ops,
              .max_threads = o->threads ? o->threads : 1};
    l.stop_fd = eventfd(0, EFD_CLOEXEC);
    l.tids = calloc(l.max_threads, sizeof *l.tids);
    int flags = fcntl(l.fd, F_GETFL);
    if (l.stop_fd < 0 || !l.tids || flags < 0 || fcntl(l.fd, F_SETFL, flags | O_NONBLOCK) != 0) {
        int e = -errno;
        if (l.stop_fd >= 0) close(l.stop_fd);
        free(l.tids);
        return e ? e : -ENOMEM;
    }
    pthread_mutex_init(&l.lock, NULL);
    pthread_cond_init(&l.seat_free, NULL);
    if (l.max_threads == 1) {
        serve(&l, true);
    } else {
        pthread_mutex_lock(&l.lock);
        start_thread(&l);
        bool none = l.started == 0;
        pthread_mutex_unlock(&l.lock);
        if (none) l.error = -EAGAIN;
        struct pollfd p = {.fd = l.stop_fd, .events = POLLIN};
        while (!none && !ending(&l)) sleep_on(&l, &p, 1, true);
        stop_all(&l, 0);
        pthread_mutex_lock(&l.lock);
        unsigned started = l.started; /* none start once stop is set */
        pthread_mutex_unlock(&l.lock);
        for (unsigned i = 0; i < started; i++) pthread_join(l.tids[i], NULL);
    }
    fcntl(l.fd, F_SETFL, flags);
    pthread_cond_destroy(&l.seat_free);
    pthread_mutex_destroy(&l.lock);
    close(l.stop_fd);
    free(l.tids);
    fuse_session_reset(se); /* as libfuse's loops do: the session may serve again */
    return l.error;
}
