#include "daemon.h"
#include "loop.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/sysmacros.h>
#include <sys/stat.h>
#include <unistd.h>

static int ready_fd = -1;

int daemon_detach(unsigned char mount_failed) {
    int fds[2];
    if (pipe(fds) != 0) return -errno;
    pid_t pid = fork();
    if (pid < 0) return -errno;
    if (pid > 0) {
        close(fds[1]);
        unsigned char status = mount_failed;
        ssize_t r;
        do r = read(fds[0], &status, 1);
        while (r < 0 && errno == EINTR);
        _exit(r == 1 ? status : mount_failed);
    }
    close(fds[0]);
    ready_fd = fds[1];
    setsid();
    return chdir("/") == 0 ? 0 : -errno;
}

void daemon_report_ready(unsigned char status) {
    if (ready_fd < 0) return;
    ssize_t r;
    do r = write(ready_fd, &status, 1);
    while (r < 0 && errno == EINTR);
    close(ready_fd);
    ready_fd = -1;
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        if (null > 2) close(null);
    }
}

typedef struct ready_ctx {
    const char *mountpoint;
    int (*on_ready)(void *ctx, dev_t dev);
    void *ctx;
    struct fuse_session *se;
    dev_t dev;    /* of the live mount, 0 if unknown */
    bool refused; /* on_ready refused the mount */
} ready_ctx;

static void *ready_thread(void *arg) {
    ready_ctx *rc = arg;
    struct stat st;
    if (stat(rc->mountpoint, &st) == 0) {
        rc->dev = st.st_dev;
        if (rc->on_ready && rc->on_ready(rc->ctx, st.st_dev) != 0) {
            /* The serving thread sleeps in the device's poll: the exit signal, which only it
             * takes, wakes it into libfuse's handler, which ends the session. */
            rc->refused = true;
            fuse_session_exit(rc->se);
            kill(getpid(), SIGTERM);
            return NULL;
        }
    }
    daemon_report_ready(0);
    return NULL;
}

/* Is a file system with this device number still in our mount table? */
static bool dev_mounted(dev_t dev) {
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f) return true; /* unknown: keep the error */
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned maj, min;
        if (sscanf(line, "%*s %*s %u:%u", &maj, &min) == 2)
            found = maj == major(dev) && min == minor(dev);
    }
    fclose(f);
    return found;
}

int daemon_serve(struct fuse_session *se, const char *mountpoint, const serve_opts *so,
                 int (*on_ready)(void *ctx, dev_t dev), void *ctx) {
    ready_ctx rc = {mountpoint, on_ready, ctx, se, 0, false};
    pthread_t ready;
    /* Signals stay with the serving thread, whose wait they must interrupt. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    bool have_ready = pthread_create(&ready, NULL, ready_thread, &rc) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!have_ready) daemon_report_ready(0);
    unsigned threads = so->single ? 1 : so->max_threads ? so->max_threads : 1;
    int loop;
    if (so->spin_us) {
        loop_opts lo = {.threads = threads, .spin_us = so->spin_us, .inline_ops = so->inline_ops};
        loop = loop_serve(se, &lo);
    } else if (threads == 1) {
        loop = fuse_session_loop(se);
    } else {
        struct fuse_loop_config *cfg = fuse_loop_cfg_create();
        fuse_loop_cfg_set_clone_fd(cfg, 1);
        fuse_loop_cfg_set_max_threads(cfg, threads);
        fuse_loop_cfg_set_idle_threads(cfg, threads);
        loop = fuse_session_loop_mt(se, cfg);
        fuse_loop_cfg_destroy(cfg);
    }
    if (have_ready) pthread_join(ready, NULL);
    if (rc.refused) return -ECANCELED;
    /* The kernel ends a lazily unmounted connection whose last user left with ECONNABORTED
     * (libfuse expects ENODEV and reports an error): with our mount gone, that is a clean
     * unmount. A connection aborted through /sys/fs/fuse/connections leaves the mount. */
    if ((loop == -ECONNABORTED || loop == ECONNABORTED) && rc.dev && !dev_mounted(rc.dev)) loop = 0;
    return loop;
}
