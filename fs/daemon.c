#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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
    void (*on_ready)(void *ctx, dev_t dev);
    void *ctx;
} ready_ctx;

static void *ready_thread(void *arg) {
    ready_ctx *rc = arg;
    struct stat st;
    if (stat(rc->mountpoint, &st) == 0 && rc->on_ready) rc->on_ready(rc->ctx, st.st_dev);
    daemon_report_ready(0);
    return NULL;
}

int daemon_serve(struct fuse_session *se, const char *mountpoint, bool single, unsigned max_threads,
                 void (*on_ready)(void *ctx, dev_t dev), void *ctx) {
    ready_ctx rc = {mountpoint, on_ready, ctx};
    pthread_t ready;
    bool have_ready = pthread_create(&ready, NULL, ready_thread, &rc) == 0;
    if (!have_ready) daemon_report_ready(0);
    int loop;
    if (single) {
        loop = fuse_session_loop(se);
    } else {
        struct fuse_loop_config *cfg = fuse_loop_cfg_create();
        fuse_loop_cfg_set_clone_fd(cfg, 1);
        fuse_loop_cfg_set_max_threads(cfg, max_threads ? max_threads : 1);
        fuse_loop_cfg_set_idle_threads(cfg, max_threads ? max_threads : 1);
        loop = fuse_session_loop_mt(se, cfg);
        fuse_loop_cfg_destroy(cfg);
    }
    if (have_ready) pthread_join(ready, NULL);
    return loop;
}
