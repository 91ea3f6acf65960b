/* `ckptfs commit MOUNTPOINT`: asks the stage mounted there to commit, and reports the outcome.
 *
 * The protocol is the control file: open MOUNTPOINT/.ckptfs/commit for reading and writing and
 * write(2) anything. The daemon commits while the write waits and answers it with success,
 * EINVAL (the staged tree has problems) or EIO (writing OUT failed). A read(2) on the same
 * descriptor then gives that commit's report: "exit N", a summary line, one line per problem.
 * While the write waits, MOUNTPOINT/.ckptfs/status shows the progress, which is drawn on
 * stderr when it is a terminal. */
#include "common/progress.h"
#include "common/message.h"
#include "common/command.h"
#include "stage.h"
#include "stage_fs.h"

#include "core/util/json.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct watcher {
    char *status_path;
    atomic_bool stop;
} watcher;

static bool read_small(const char *path, strbuf *sb) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    sb_clear(sb);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) sb_put(sb, buf, (size_t)n);
    close(fd);
    return n == 0 && !sb->failed;
}

static bool progress_of(const strbuf *status, uint64_t *done, uint64_t *total) {
    json_doc doc;
    json_error err;
    if (!status->data || json_parse(&doc, status->data, status->len, &err) != 0) return false;
    const json_value *p = json_member(doc.root, "progress");
    bool ok = json_str_eq(json_member(doc.root, "state"), "committing") &&
              json_as_u64(json_member(p, "done"), done) &&
              json_as_u64(json_member(p, "total"), total);
    json_doc_free(&doc);
    return ok;
}

static void *watch_progress(void *arg) {
    watcher *w = arg;
    progress_line p;
    bool started = false;
    uint64_t shown = 0;
    strbuf sb;
    sb_init(&sb);
    while (!atomic_load(&w->stop)) {
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
        uint64_t done, total;
        if (atomic_load(&w->stop) || !read_small(w->status_path, &sb) ||
            !progress_of(&sb, &done, &total) || total == 0)
            continue;
        if (!started) {
            progress_start(&p, "commit", total);
            started = true;
        }
        p.total = total;
        if (done > shown) {
            progress_add(&p, done - shown);
            shown = done;
        }
    }
    if (started) progress_end(&p);
    sb_free(&sb);
    return NULL;
}

static void commit_usage(FILE *out) {
    command_print_usage(out, "commit");
    fprintf(out,
            "Validate the tree staged at MOUNTPOINT (by `ckptfs stage`) and write its archive.\n"
            "Every problem is listed with the path of the file concerned; nothing is written\n"
            "then, and the staged files stay as they are.\n"
            "Exit status: 0 written, 1 usage or not a staging mount, 2 the staged tree has\n"
            "problems, 3 writing the archive failed.\n");
}

int commit_main(int argc, char **argv) {
    const char *mnt = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            commit_usage(stdout);
            return 0;
        }
        if (argv[i][0] == '-' || mnt) {
            msg_error("commit", "unexpected argument %s (try: ckptfs commit --help)", argv[i]);
            return STAGE_USAGE;
        }
        mnt = argv[i];
    }
    if (!mnt) {
        msg_error("commit", "expected MOUNTPOINT (try: ckptfs commit --help)");
        return STAGE_USAGE;
    }
    strbuf path;
    sb_init(&path);
    sb_printf(&path, "%s/.ckptfs/commit", mnt);
    int fd = path.failed ? -1 : open(path.data, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        bool not_stage = e == ENOENT || e == ENOTDIR || e == EACCES || e == EROFS;
        msg_error("commit", "%s: %s", mnt,
                  not_stage ? "not a ckptfs staging mount (no .ckptfs/commit to write)"
                            : strerror(e));
        sb_free(&path);
        return not_stage ? STAGE_USAGE : STAGE_WRITE_FAILED;
    }
    watcher w = {.stop = false};
    pthread_t watch;
    bool watching = false;
    if (isatty(2) == 1) {
        sb_clear(&path);
        sb_printf(&path, "%s/.ckptfs/status", mnt);
        w.status_path = path.data;
        watching = !path.failed && pthread_create(&watch, NULL, watch_progress, &w) == 0;
    }
    ssize_t wr = write(fd, "commit\n", 7);
    int write_errno = errno;
    atomic_store(&w.stop, true);
    if (watching) pthread_join(watch, NULL);
    sb_free(&path);

    strbuf report;
    sb_init(&report);
    char buf[65536];
    ssize_t n;
    /* from offset 0: the write moved the descriptor's offset */
    for (off_t at = 0; (n = pread(fd, buf, sizeof buf, at)) > 0; at += n)
        sb_put(&report, buf, (size_t)n);
    close(fd);
    int status;
    const char *body = report.data ? strchr(report.data, '\n') : NULL;
    if (!body || sscanf(report.data, "exit %d", &status) != 1 || status < 0 || status > 3) {
        if (wr >= 0) {
            sb_free(&report);
            return 0;
        }
        msg_error("commit", "%s: the commit failed: %s", mnt, strerror(write_errno));
        sb_free(&report);
        return STAGE_WRITE_FAILED;
    }
    body++;
    if (status == STAGE_OK) {
        fputs("ckptfs commit: ", stdout);
        msg_print_lines(stdout, body);
    } else {
        fputs("ckptfs commit: ", stderr);
        msg_print_lines(stderr, body);
    }
    sb_free(&report);
    return status;
}
