/* `ckptfs stage OUT MOUNTPOINT [--from SOURCE]`: mounts a writable staging tree whose content
 * becomes OUT on commit, and commits what is left on unmount. `ckptfs commit MOUNTPOINT`
 * (stage_client.c) asks a running stage to commit.
 *
 * Like the read-only mount, the command checks everything it can in the foreground (OUT's
 * name, the spool, the source) and returns only once the mount answers. */
#include "stage.h"
#include "common/message.h"
#include "common/command.h"

#include "common/daemon.h"
#include "common/mount_opts.h"
#include "common/mountpoint.h"
#include "common/optval.h"
#include "common/size.h"
#include "stage_ops.h"

#include "core/write/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

typedef struct stage_options {
    mount_opts m; /* OUT MOUNTPOINT, -f -d -s -h allow_other max_threads */
    char *from, *spool, *max_shard_size;
    int nocommit;
} stage_options;

#define OPT(t, field, value)                                                                       \
    { t, offsetof(stage_options, field), value }
static const struct fuse_opt stage_spec[] = {
    MOUNT_OPTS_SPEC(stage_options, m),
    OPT("spool=%s", spool, 0),
    OPT("nocommit", nocommit, 1),
    OPT("max_shard_size=%s", max_shard_size, 0),
    FUSE_OPT_END,
};

static void usage(FILE *out) {
    command_print_usage(out, "stage");
    fprintf(out,
            "Mount a writable staging tree; on commit its tensors become the archive OUT.\n"
            "A tensor is NAME (raw little-endian bytes) + NAME.json ({\"dtype\", \"shape\"}), or\n"
            "NAME.npy. Paths give names ('/' -> '.'); a sidecar's \"name\" is kept where the\n"
            "file sits at that name's path.\n"
            "\n"
            "  OUT                the archive to write, by its name (+ .zst: seekable zstd):\n"
            "                     %s,\n"
            "                     or DIR/ for a Hugging Face directory\n"
            "  --from SOURCE      start from the tensors of SOURCE (never modified)\n"
            "  -f, -d, -s         foreground, debug, one thread\n"
            "  -o spool=DIR       where staged bytes go (default: .OUT.stage/ next to OUT)\n"
            "  -o max_threads=N   worker threads (default 8; commits get their own)\n"
            "  -o nocommit        no commit on unmount: the spool stays until a commit\n"
            "  -o max_shard_size=S  shards of a DIR/ OUT (e.g. 2GiB; default 5GB)\n"
            "\n"
            "Commit with `ckptfs commit MOUNTPOINT` (or a write to MOUNTPOINT/.ckptfs/commit),\n"
            "and on unmount (`ckptfs umount MOUNTPOINT` waits for that commit and gives its exit\n"
            "status; fusermount3 -u does not wait). Progress and the last report are in\n"
            "MOUNTPOINT/.ckptfs/status, or `ckptfs stage --status OUT` once unmounted. A stage\n"
            "whose daemon was killed is taken up again by\n"
            "running the same `ckptfs stage OUT MOUNTPOINT`. The same as a mount option:\n"
            "`ckptfs SOURCE MOUNTPOINT -o stage=OUT` (SOURCE none: an empty stage).\n"
            "Exit status: 0 mounted, 1 usage, 2 the source or the spool cannot be used, 3 the\n"
            "mount failed. See ckptfs(1), STAGING.\n",
            ckpt_writer_suffixes());
}

static int on_option(void *data, const char *arg, int key, struct fuse_args *outargs) {
    (void)outargs;
    stage_options *o = data;
    int shared = mount_opts_key(&o->m, arg, key);
    return shared != MOUNT_OPTS_NOT_MINE ? shared : 1; /* FUSE options go on to libfuse */
}

/* --from takes the next argument (or =VALUE); fuse_opt would also match "--from=X" against a
 * "--from %s" template, so it is taken out here first. */
static int take_from(int *argc, char **argv, char **from) {
    int w = 0;
    for (int r = 0; r < *argc; r++) {
        if (strcmp(argv[r], "--from") == 0) {
            if (r + 1 >= *argc) {
                msg_error("stage", "--from needs a SOURCE");
                return -1;
            }
            free(*from);
            *from = strdup(argv[++r]);
        } else if (strncmp(argv[r], "--from=", 7) == 0) {
            free(*from);
            *from = strdup(argv[r] + 7);
        } else {
            argv[w++] = argv[r];
        }
    }
    *argc = w;
    argv[w] = NULL;
    return 0;
}

/* True when path is dir or lies below it (both absolute, without "." or ".."). */
static bool is_under(const char *path, const char *dir) {
    size_t n = strlen(dir);
    if (strcmp(dir, "/") == 0) return true;
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* Every file open in the stage holds a descriptor of its spool file: allow as many as the
 * system lets us. (A commit holds only a few: core/write/staged.c opens staged bytes per read.) */
static void raise_file_limit(void) {
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
        r.rlim_cur = r.rlim_max;
        setrlimit(RLIMIT_NOFILE, &r);
    }
}

static void stage_free(stage *st) {
    while (st->handles) { /* never released by the kernel: the connection ended first */
        handle *h = st->handles;
        handle_untrack(st, h);
        free(h->text);
        free(h);
    }
    pthread_mutex_destroy(&st->handles_lock);
    while (st->removed) snode_free(st->removed); /* each takes itself off the list */
    snode_free_tree(st->root);
    ckpt_close(st->lower);
    for (size_t i = 0; i < st->nretired; i++) ckpt_close(st->retired[i]);
    free(st->retired);
    spool_close(st);
    free(st->control.name);
    free(st->commit_node.name);
    free(st->status_node.name);
    free(st->last_report);
    free(st->out);
    free(st->from);
    free(st->spool);
    free(st->mountpoint);
    pthread_mutex_destroy(&st->lock);
    pthread_mutex_destroy(&st->commit_lock);
    pthread_mutex_destroy(&st->wb_lock);
    pthread_cond_destroy(&st->wb_cond);
    pthread_rwlock_destroy(&st->gate);
}

static void init_control(snode *n, sn_kind kind, const char *name) {
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->name = strdup(name);
    n->name_len = strlen(name);
    n->fd = -1;
    clock_gettime(CLOCK_REALTIME, &n->mtime);
}

static void stage_init(stage *st) {
    memset(st, 0, sizeof *st);
    st->spool_fd = st->data_fd = st->lock_fd = st->journal_fd = st->pack_fd = -1;
    st->uid = getuid();
    st->gid = getgid();
    st->timeout = 1.0;
    pthread_mutex_init(&st->lock, NULL);
    pthread_mutex_init(&st->commit_lock, NULL);
    pthread_mutex_init(&st->handles_lock, NULL);
    pthread_mutex_init(&st->wb_lock, NULL);
    pthread_cond_init(&st->wb_cond, NULL);
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    /* A waiting commit makes new changes fail at once instead of starving it. */
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&st->gate, &ra);
    pthread_rwlockattr_destroy(&ra);
    init_control(&st->control, SN_CONTROL_DIR, ".ckptfs");
    init_control(&st->commit_node, SN_COMMIT, "commit");
    init_control(&st->status_node, SN_STATUS, "status");
}

/* A detached daemon's stderr is /dev/null: the report of its last commit goes to syslog (the
 * journal) as well, one line each, so a failure nobody waited for is on record. */
static void log_report(const stage *st, const char *report, int status) {
    openlog("ckptfs", LOG_PID, LOG_USER);
    for (const char *line = report; line && *line;) {
        const char *end = strchr(line, '\n');
        int n = end ? (int)(end - line) : (int)strlen(line);
        if (strncmp(line, "exit ", 5) != 0)
            syslog(status ? LOG_ERR : LOG_INFO, "stage %s: commit on unmount: %.*s", st->out, n,
                   line);
        line = end ? end + 1 : NULL;
    }
    closelog();
}

/* After the loop: whatever was staged and not yet written goes to OUT; a stage that is fully
 * in OUT leaves no spool behind. The outcome is written into SPOOL/lock before the daemon lets
 * go of it, for `ckptfs umount` (stage_status.c), which waits for that lock. */
static int commit_on_unmount(stage *st, bool commit, bool detached) {
    int status = 0;
    if (st->dirty && commit) {
        char *report = NULL;
        status = stage_commit(st, &report);
        if (report) {
            const char *body = strchr(report, '\n');
            msg_print_lines(stderr, body ? body + 1 : report);
            if (detached) log_report(st, report, status);
        }
        free(report);
    }
    spool_note_outcome(st, st->dirty && !commit ? "nocommit" : status ? "failed" : "done", status);
    if (!st->dirty) spool_remove(st);
    return status;
}

int stage_mount(const stage_request *req, struct fuse_args *args) {
    stage st;
    stage_init(&st);
    int status = STAGE_USAGE;
    struct fuse_session *se = NULL;
    char mnt[PATH_MAX], from[PATH_MAX];
    if (!realpath(req->mountpoint, mnt)) {
        msg_error("stage", "mount point %s: %s", req->mountpoint, strerror(errno));
        goto out;
    }
    if (!mountpoint_usable("ckptfs stage", mnt)) goto out;
    if (!(st.out = stage_out_path(req->out)) || !(st.spool = stage_spool_path(st.out, req->spool)))
        goto out;
    if (parse_size_option(req->max_shard_size, &st.max_shard_size) != 0) {
        msg_error("stage", "max_shard_size=%s: expected a size such as 5GB, 500MB, 2GiB",
                  req->max_shard_size);
        goto out;
    }
    /* ckpt_write would turn a file name into a directory of that name: say so instead. */
    if (req->max_shard_size && st.out[strlen(st.out) - 1] != '/') {
        msg_error("stage",
                  "max_shard_size=%s: only a Hugging Face directory OUT (DIR/) is "
                  "split into shards; %s is one file",
                  req->max_shard_size, st.out);
        goto out;
    }
    st.mountpoint = strdup(mnt);
    /* Inside the mount they would be reached through the mount itself. */
    if (is_under(st.out, mnt) || is_under(st.spool, mnt)) {
        msg_error("stage", "%s %s is inside the mount point %s (put it elsewhere%s)",
                  is_under(st.out, mnt) ? "OUT" : "the spool",
                  is_under(st.out, mnt) ? st.out : st.spool, mnt,
                  is_under(st.out, mnt) ? "" : ", or choose one with -o spool=DIR");
        goto out;
    }
    status = STAGE_INVALID;
    if (req->from && !realpath(req->from, from)) {
        msg_error("stage", "--from %s: %s", req->from, strerror(errno));
        goto out;
    }
    if (req->from && !mountpoint_apart("ckptfs stage", mnt, from, NULL)) {
        status = STAGE_USAGE;
        goto out;
    }
    if (req->from) st.from = strdup(from);
    raise_file_limit();
    bool resumed;
    hashmap lower_paths;
    if ((status = spool_setup(&st, req->from, &resumed, &lower_paths)) != 0) goto out;
    status = journal_restore(&st, resumed, &lower_paths);
    hm_free(&lower_paths);
    if (status) {
        if (!resumed) spool_remove(&st); /* nothing was staged in it */
        goto out;
    }
    stage_own_ctime_change(&st, NULL, true);
    spool_tidy(&st, resumed);
    stage_own_ctime_change(&st, NULL, false);
    struct stat os;
    if (resumed)
        msg_error("stage", "continuing the stage of %s kept in %s", st.out, st.spool);
    else if (!st.from && stat(st.out, &os) == 0)
        msg_error("stage",
                  "note: %s exists; this stage starts empty and a commit "
                  "replaces it (stage with --from %s to start from its tensors)",
                  st.out, st.out);

    fuse_opt_add_arg(args, "-osubtype=ckptfs");
    fuse_opt_add_arg(args, "-ofsname=ckptfs-stage");
    fuse_opt_add_arg(args, "-odefault_permissions");
    status = STAGE_USAGE;
    se = fuse_session_new(args, &stage_ops, sizeof stage_ops, &st);
    if (!se) goto out;
    status = STAGE_WRITE_FAILED;
    if (fuse_set_signal_handlers(se) != 0) goto out_session;
    if (fuse_session_mount(se, mnt) != 0) {
        if (!resumed) spool_remove(&st); /* nothing was staged in it */
        goto out_handlers;
    }
    if (!req->foreground && daemon_detach(3) != 0) {
        msg_error("stage", "cannot detach: %s", strerror(errno));
        goto out_unmount;
    }
    spool_note_pid(&st);
    /* 8 threads by default: on a quiet 2-core machine a warm cp + commit measured 1.07-1.10x
     * cp + sync with 8 against 0.64-0.76x with one (make bench, same rounds). Under heavy load
     * one thread won (1.2x against 0.8x), as the same thread then takes each request of a
     * sequential writer; -o max_threads=1 gives that. Since the pack's writes are answered
     * before they are made (stage_io.c), 8 threads do as well as one under load (1.30 s
     * against 1.26 s for 2 GiB, load ~5). Commits run on threads of their own, so the loop
     * still answers during one. */
    serve_opts so = {.single = req->single, .max_threads = req->max_threads ? req->max_threads : 8};
    daemon_serve(se, mnt, &so, NULL, NULL); /* libfuse's loops: no spinning (ckptfs(1)) */
    while (atomic_load(&st.commit_threads)) /* their replies need the session */
        usleep(10000);
out_unmount:
    fuse_session_unmount(se);
    status = commit_on_unmount(&st, !req->nocommit, !req->foreground);
out_handlers:
    fuse_remove_signal_handlers(se);
out_session:
    fuse_session_destroy(se);
out:
    daemon_report_ready(status ? (unsigned char)status : 3);
    stage_free(&st);
    return status;
}

int stage_main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--status") == 0) return stage_status_main(argc, argv);
    stage_options o = {0};
    unsigned max_threads = 0; /* stage_mount's default */
    if (take_from(&argc, argv, &o.from) != 0) return STAGE_USAGE;
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    int status = STAGE_USAGE;
    if (fuse_opt_parse(&args, &o, stage_spec, on_option) != 0) goto out;
    if (o.m.help) {
        usage(stdout);
        status = 0;
        goto out;
    }
    if (!o.m.first || !o.m.mountpoint || o.m.extra_args) {
        msg_error("stage", "expected OUT and MOUNTPOINT (try: ckptfs stage --help)");
        goto out;
    }
    if (o.m.max_threads && !parse_uint_option(o.m.max_threads, 1, 1024, &max_threads)) {
        msg_error("stage", "max_threads=%s: expected a whole number from 1 to 1024",
                  o.m.max_threads);
        goto out;
    }
    stage_request req = {.out = o.m.first,
                         .mountpoint = o.m.mountpoint,
                         .from = o.from,
                         .spool = o.spool,
                         .max_shard_size = o.max_shard_size,
                         .max_threads = max_threads,
                         .nocommit = o.nocommit,
                         .foreground = o.m.foreground,
                         .single = o.m.single};
    status = stage_mount(&req, &args);
out:
    fuse_opt_free_args(&args);
    mount_opts_free(&o.m);
    free(o.from);
    free(o.spool);
    free(o.max_shard_size);
    return status;
}
