/* What became of a stage once nobody watches its mount:
 *
 *   ckptfs stage --status OUT [-o spool=DIR]   the spool of OUT: is a daemon serving it, are
 *                                              there changes not in OUT, the last commit's report
 *   ckptfs umount MOUNTPOINT                   unmounts, and for a stage waits for the commit
 *                                              the daemon makes after it, with its exit status
 *
 * fusermount3 -u returns as soon as the kernel lets go of the mount, before the daemon's commit
 * on unmount (FUSE has no way to make it wait). The daemon holds SPOOL/lock (flock) until it
 * ends and writes its outcome into it just before (stage_spool.c), so waiting for the lock is
 * waiting for the commit. */
#include "stage.h"
#include "common/message.h"
#include "common/command.h"
#include "stage_fs.h"
#include "common/mountpoint.h"

#include "core/util/json.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

static bool read_text(int dirfd, const char *name, strbuf *sb) {
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    sb_clear(sb);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0 && sb->len < (1u << 20)) sb_put(sb, buf, (size_t)n);
    close(fd);
    return !sb->failed;
}

/* True when the journal has a change after its last "C" (OUT is behind the stage). */
static bool changes_pending(int spool_fd) {
    strbuf j;
    sb_init(&j);
    bool pending = false;
    if (read_text(spool_fd, "journal", &j) && j.data) {
        const char *last_c = NULL;
        for (const char *p = j.data; (p = strstr(p, "\nC\n")); p++) last_c = p + 3;
        const char *rest = last_c ? last_c : strchr(j.data, '\n');
        /* a snapshot's "c" line and the header are no change */
        pending = rest && rest[0] && strspn(rest, "\n") != strlen(rest);
    }
    sb_free(&j);
    return pending;
}

/* The outcome line in SPOOL/lock: a pid while a daemon runs, then "done N" / "failed N" /
 * "nocommit N". */
static void lock_text(int fd, char *out, size_t cap) {
    ssize_t r = pread(fd, out, cap - 1, 0);
    out[r > 0 ? r : 0] = '\0';
    out[strcspn(out, "\n")] = '\0';
}

static int print_report(int spool_fd, FILE *to) {
    strbuf r;
    sb_init(&r);
    int status = 0;
    if (read_text(spool_fd, "last-commit", &r) && r.data &&
        sscanf(r.data, "exit %d", &status) == 1) {
        const char *body = strchr(r.data, '\n');
        fprintf(to, "last commit: exit %d\n%s", status, body ? body + 1 : "\n");
    } else {
        fprintf(to, "last commit: none\n");
    }
    sb_free(&r);
    return status;
}

int stage_status_main(int argc, char **argv) {
    const char *out = NULL, *spool_opt = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--status") == 0) continue;
        if (strcmp(argv[i], "-o") == 0 && i + 1 < argc && strncmp(argv[i + 1], "spool=", 6) == 0)
            spool_opt = argv[++i] + 6;
        else if (argv[i][0] != '-' && !out)
            out = argv[i];
        else {
            fprintf(stderr, "Usage: ckptfs stage --status OUT [-o spool=DIR]\n");
            return STAGE_USAGE;
        }
    }
    if (!out) {
        fprintf(stderr, "Usage: ckptfs stage --status OUT [-o spool=DIR]\n");
        return STAGE_USAGE;
    }
    char *spool = stage_spool_of(out, spool_opt);
    if (!spool) return STAGE_USAGE;
    int spool_fd = open(spool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (spool_fd < 0) {
        printf("%s: no stage (no spool %s): nothing waits to be committed\n", out, spool);
        free(spool);
        return 0;
    }
    int lock = openat(spool_fd, "lock", O_RDONLY | O_CLOEXEC);
    char what[64] = "";
    bool served = false;
    if (lock >= 0) {
        served = flock(lock, LOCK_EX | LOCK_NB) != 0;
        lock_text(lock, what, sizeof what);
        close(lock);
    }
    printf("spool: %s\n", spool);
    if (served)
        printf("mounted: yes, daemon pid %s\n", what);
    else if (what[0] && strncmp(what, "done", 4) && strncmp(what, "failed", 6) &&
             strncmp(what, "nocommit", 8))
        printf("mounted: no (its daemon, pid %s, ended without finishing: killed?)\n", what);
    else
        printf("mounted: no%s%s%s\n", what[0] ? " (ended: " : "", what, what[0] ? ")" : "");
    bool pending = changes_pending(spool_fd);
    printf("changes not in OUT: %s\n", pending ? "yes" : "no");
    int status = print_report(spool_fd, stdout);
    close(spool_fd);
    free(spool);
    return status;
}

static int run_fusermount(const char *mnt) {
    pid_t pid = fork();
    if (pid < 0) return -errno;
    if (pid == 0) {
        execlp("fusermount3", "fusermount3", "-u", mnt, (char *)NULL);
        msg_error("umount", "cannot run fusermount3: %s", strerror(errno));
        _exit(127);
    }
    int ws;
    while (waitpid(pid, &ws, 0) < 0)
        if (errno != EINTR) return -errno;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 1;
}

/* The spool of the stage mounted at mnt, from its .ckptfs/status; NULL for other mounts. */
static char *spool_of_mount(const char *mnt) {
    strbuf path, text;
    sb_init(&path);
    sb_init(&text);
    sb_printf(&path, "%s/.ckptfs", mnt);
    char *spool = NULL;
    int dfd = path.failed ? -1 : open(path.data, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0 && read_text(dfd, "status", &text) && text.data) {
        json_doc doc;
        json_error err;
        if (json_parse(&doc, text.data, text.len, &err) == 0) {
            const json_value *v = json_member(doc.root, "spool");
            if (v && v->type == JSON_STRING && json_member(doc.root, "last_commit"))
                spool = strndup(v->str, v->len);
            json_doc_free(&doc);
        }
    }
    if (dfd >= 0) close(dfd);
    sb_free(&path);
    sb_free(&text);
    return spool;
}

/* True when /proc/self/mounts has a staging mount (fsname ckptfs-stage) at mnt: one whose
 * status cannot be read any more is one whose daemon is gone. */
static bool is_stage_mount(const char *mnt) {
    char *copy = strdup(mnt), *copy2 = strdup(mnt);
    char dir[PATH_MAX], want[PATH_MAX + NAME_MAX + 2];
    bool found = false;
    if (copy && copy2 && realpath(dirname(copy), dir)) {
        snprintf(want, sizeof want, "%s/%s", strcmp(dir, "/") ? dir : "", basename(copy2));
        FILE *f = fopen("/proc/self/mounts", "r");
        char line[8192], src[4096], at[4096];
        while (f && !found && fgets(line, sizeof line, f))
            found = sscanf(line, "%4095s %4095s", src, at) == 2 &&
                    strcmp(src, "ckptfs-stage") == 0 && strcmp(at, want) == 0;
        if (f) fclose(f);
    }
    free(copy);
    free(copy2);
    return found;
}

static void umount_usage(FILE *to) {
    command_print_usage(to, "umount");
    fprintf(to,
            "Unmount a ckptfs mount. For a staging mount, wait for the commit its daemon makes\n"
            "after the unmount and exit with its status: 0 committed (or nothing to commit,\n"
            "or nocommit), 2 the staged tree has problems, 3 writing OUT failed or the daemon\n"
            "ended without finishing; the report goes to stderr. 1: not unmounted.\n");
}

int umount_main(int argc, char **argv) {
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        umount_usage(stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        umount_usage(stderr);
        return STAGE_USAGE;
    }
    const char *mnt = argv[1];
    /* Only a mount of ours: fusermount3 would say "Invalid argument" of a plain directory. */
    char real[PATH_MAX], type[128], source[PATH_MAX];
    if (!realpath(mnt, real)) {
        fprintf(stderr, "ckptfs umount: %s: %s\n", mnt, strerror(errno));
        return STAGE_USAGE;
    }
    if (!mount_at(real, type, sizeof type, source, sizeof source)) {
        fprintf(stderr, "ckptfs umount: %s: not a ckptfs mount (nothing is mounted there)\n", mnt);
        return STAGE_USAGE;
    }
    if (strcmp(type, "fuse") != 0 && strncmp(type, "fuse.", 5) != 0) {
        fprintf(stderr,
                "ckptfs umount: %s: not a ckptfs mount (%s, of type %s, is mounted there)\n", mnt,
                source, type);
        return STAGE_USAGE;
    }
    char *spool = spool_of_mount(mnt);
    bool orphan = !spool && is_stage_mount(mnt);
    int spool_fd = spool ? open(spool, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    int lock = spool_fd >= 0 ? openat(spool_fd, "lock", O_RDONLY | O_CLOEXEC) : -1;
    int rc = run_fusermount(mnt);
    if (rc != 0) {
        if (lock >= 0) close(lock);
        if (spool_fd >= 0) close(spool_fd);
        free(spool);
        return STAGE_USAGE;
    }
    int status = 0;
    if (lock >= 0) {
        /* The daemon holds it until its commit is done and it exits. */
        while (flock(lock, LOCK_SH) != 0 && errno == EINTR) {
        }
        char what[64];
        lock_text(lock, what, sizeof what);
        int n = 0;
        if (sscanf(what, "done %d", &n) == 1 || sscanf(what, "nocommit %d", &n) == 1) {
            if (what[0] == 'n')
                msg_error("umount", "%s: nocommit: the changes stay in %s", mnt, spool);
        } else if (sscanf(what, "failed %d", &n) == 1 && n > 0) {
            msg_error("umount",
                      "%s: the commit on unmount failed (the staged files "
                      "are kept in %s)",
                      mnt, spool);
            print_report(spool_fd, stderr);
            status = n;
        } else {
            msg_error("umount",
                      "%s: the stage's daemon ended without finishing its "
                      "commit (killed?); the spool %s is kept",
                      mnt, spool);
            status = STAGE_WRITE_FAILED;
        }
        close(lock);
    } else if (orphan) {
        msg_error("umount",
                  "%s: the stage's daemon ended without finishing (killed?): "
                  "no commit on unmount ran; its spool is kept (ckptfs stage OUT %s takes "
                  "it up again)",
                  mnt, mnt);
        status = STAGE_WRITE_FAILED;
    } else if (spool) {
        msg_error("umount", "%s: cannot wait for the commit on unmount (%s/lock: %s)", mnt, spool,
                  strerror(errno));
        status = STAGE_WRITE_FAILED;
    }
    if (spool_fd >= 0) close(spool_fd);
    free(spool);
    return status;
}
