/* ckptfs SOURCE MOUNTPOINT: opens and validates the checkpoint in the foreground (so a bad
 * source fails with one line and a non-zero exit before anything is mounted), mounts, then
 * detaches once the mount answers and its readahead is set.
 *
 * With -o stage=OUT the same command line makes a staging mount instead (stage.c), so that
 * mount(8) and fstab, which only know SOURCE MOUNTPOINT -o OPTIONS, can make one too. */
#include "ckptfs.h"
#include "changed.h"
#include "common/mount_log.h"
#include "core/views/stats.h"
#include "core/write/gguf_view.h"
#include "common/daemon.h"
#include "common/loop.h"
#include "common/heap.h"
#include "common/mountpoint.h"
#include "common/command.h"
#include "common/message.h"
#include "common/stage_request.h"
#include "mount_main.h"
#include "readahead.h"
#include "common/optval.h"
#include "common/passthrough.h"
#include "common/mount_opts.h"
#include "common/remote_opts.h"
#include "common/size.h"
#include "common/view_job.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fcntl.h>

enum exit_code { EXIT_MOUNTED = 0, EXIT_USAGE = 1, EXIT_SOURCE = 2, EXIT_MOUNT = 3 };

typedef struct options {
    mount_opts m;       /* SOURCE MOUNTPOINT, -f -d -s -h allow_other max_threads */
    char *readahead_kb; /* the numbers as given: checked by fs/optval.c */
    char *spin_us;
    int splice;
    int npy;
    char *timeout;
    char *view;           /* "tree" (default), "hf" or "gguf" */
    char *gguf_type;      /* view=gguf's tensor type (convert's --dtype), or NULL */
    char *max_shard_size; /* as given, e.g. "5GB" */
    char *tp_split;       /* GLOB:DIM[,...] for tensor-parallel checkpoints */
    char *revision;       /* HF cache repo folder: the ref or commit to mount */
    char *as_dtype;       /* "f32": convert narrow and quantized tensors on read */
    char *passthrough;    /* "auto" (default), "off", "on" */
    char *stage;          /* OUT: a staging mount instead of a read-only one */
    char *spool;          /* staging: where staged bytes go */
    int nocommit;         /* staging: no commit on unmount */
    int ro;               /* -o ro was given */
    char *read_only_opt;  /* the first option only a read-only mount takes, as given */
    char *staging_opt;    /* the first option only a staging mount takes, as given */
    int version;
    remote_opts remote;  /* s3_endpoint=, cache_dir=, block_size=, ... */
    char *remote_bad;    /* why a remote option's value was refused */
    char *uid, *gid;     /* owner shown for every file (default: the mounting user) */
    char *log;           /* -o log=FILE: where a detached mount says why reads fail */
    char *umask;         /* octal bits taken off every mode (never added: see ckptfs(1)) */
    int fsname, subtype; /* given by the user: passed on instead of ckptfs's own */
} options;

enum {
    KEY_VERSION,
    KEY_FSNAME,
    KEY_SUBTYPE,
    KEY_RO,
    KEY_READ_ONLY_OPT, /* also matched by its value template above: noted, then dropped */
    KEY_STAGING_OPT,
    KEY_REMOTE,
};

#define OPT(t, field, value)                                                                       \
    { t, offsetof(options, field), value }
static const struct fuse_opt option_spec[] = {
    MOUNT_OPTS_SPEC(options, m),
    OPT("readahead_kb=%s", readahead_kb, 0),
    OPT("spin_us=%s", spin_us, 0),
    OPT("splice", splice, 1),
    OPT("npy", npy, 1),
    OPT("nonpy", npy, 0),
    OPT("nosplice", splice, 0),
    OPT("timeout=%s", timeout, 0),
    OPT("view=%s", view, 0),
    OPT("gguf_type=%s", gguf_type, 0),
    OPT("max_shard_size=%s", max_shard_size, 0),
    OPT("tp_split=%s", tp_split, 0),
    OPT("revision=%s", revision, 0),
    OPT("as_dtype=%s", as_dtype, 0),
    OPT("passthrough=%s", passthrough, 0),
    OPT("stage=%s", stage, 0),
    OPT("spool=%s", spool, 0),
    OPT("nocommit", nocommit, 1),
    OPT("uid=%s", uid, 0),
    OPT("log=%s", log, 0),
    FUSE_OPT_KEY("log=", KEY_READ_ONLY_OPT),
    OPT("gid=%s", gid, 0),
    OPT("umask=%s", umask, 0),
    FUSE_OPT_KEY("uid=", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("gid=", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("umask=", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("fsname=", KEY_FSNAME),
    FUSE_OPT_KEY("subtype=", KEY_SUBTYPE),
    FUSE_OPT_KEY("readahead_kb=", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("spin_us=", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("splice", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("nosplice", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("npy", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("nonpy", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("timeout=", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("view=", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("gguf_type=", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("tp_split=", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("revision=", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("as_dtype=", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("passthrough=", KEY_READ_ONLY_OPT),
    FUSE_OPT_KEY("spool=", KEY_STAGING_OPT),
    FUSE_OPT_KEY("nocommit", KEY_STAGING_OPT),
    FUSE_OPT_KEY("s3_endpoint=", KEY_REMOTE),
    FUSE_OPT_KEY("s3_region=", KEY_REMOTE),
    FUSE_OPT_KEY("s3_addressing=", KEY_REMOTE),
    FUSE_OPT_KEY("cache_dir=", KEY_REMOTE),
    FUSE_OPT_KEY("cache_size=", KEY_REMOTE),
    FUSE_OPT_KEY("cache_ram=", KEY_REMOTE),
    FUSE_OPT_KEY("block_size=", KEY_REMOTE),
    FUSE_OPT_KEY("prefetch=", KEY_REMOTE),
    FUSE_OPT_KEY("remote_timeout=", KEY_REMOTE),
    FUSE_OPT_KEY("retries=", KEY_REMOTE),
    FUSE_OPT_KEY("ro", KEY_RO),
    FUSE_OPT_KEY("-V", KEY_VERSION),
    FUSE_OPT_KEY("--version", KEY_VERSION),
    FUSE_OPT_END,
};

/* One screen (24 lines of 80 columns): the Usage line and the list of commands come from
 * fs/main.c's table. ckptfs(1) says more about each option. */
static void usage(FILE *out) {
    char names[256];
    command_names(" ", names, sizeof names);
    command_print_usage(out, "");
    fprintf(out,
            "Mount a checkpoint read-only: a file, a directory, an HF cache folder or an\n"
            "http(s)://, s3://, hf:// URL. -f foreground, -d debug, -s one thread, -V version\n"
            "Options (-o):\n"
            "  view=hf|gguf       at the root: HF layout (max_shard_size=S) or NAME.gguf\n"
            "  npy, nonpy         NAME.npy next to tensors numpy can hold (default: npy)\n"
            "  as_dtype=f32       read F16/BF16/F8, ggml Q4-Q8/TQ/MXFP4/Q4_K/Q6_K as F32\n"
            "  tp_split=GLOB:DIM  split dim of tensor-parallel tensors (';' between rules)\n"
            "  revision=REV       HF cache repo folder: this ref or commit id (default main)\n"
            "  readahead_kb=N     kernel readahead in KiB (default 1024, 0 leaves it; root)\n"
            "  splice, passthrough=auto|off|on  splice replies; the kernel reads whole files\n"
            "  max_threads=N, spin_us=N  threads (default 8); us to await requests (100)\n"
            "  timeout=SECONDS    how long the kernel caches names and attributes (86400)\n"
            "  allow_other        let other users in; FUSE options (fsname=, ...) pass on\n"
            "  uid=N, gid=N, umask=M  owner of every file; mode bits taken off (never added)\n"
            "  log=FILE           why reads fail (default: stderr; syslog once detached)\n"
            "  stage=OUT          a writable staging mount instead (ckptfs stage --help);\n"
            "                     also spool=DIR, nocommit, max_shard_size=S, max_threads=N\n"
            "  s3_endpoint=URL, s3_region=R, s3_addressing=MODE  remote: the S3 service\n"
            "  cache_dir=DIR, cache_size=S, cache_ram=S, block_size=S  remote: block cache\n"
            "  prefetch=N, remote_timeout=SECONDS, retries=N  remote: fetching\n"
            "\n"
            "Commands: %s\n"
            "Exit status: 0 mounted, 1 usage, 2 bad source, 3 mount failed. See ckptfs(1).\n",
            names);
}

static int on_option(void *data, const char *arg, int key, struct fuse_args *outargs) {
    (void)outargs;
    options *o = data;
    int shared = mount_opts_key(&o->m, arg, key);
    if (shared != MOUNT_OPTS_NOT_MINE) return shared;
    switch (key) {
    case KEY_VERSION:
        o->version = 1;
        return 0;
    case KEY_RO:
        o->ro = 1;
        return 1;
    case KEY_FSNAME: /* libfuse takes it: kept, and ckptfs adds none of its own */
        o->fsname = 1;
        return 1;
    case KEY_SUBTYPE:
        o->subtype = 1;
        return 1;
    case KEY_READ_ONLY_OPT:
        if (!o->read_only_opt) o->read_only_opt = strdup(arg);
        return 0;
    case KEY_STAGING_OPT:
        if (!o->staging_opt) o->staging_opt = strdup(arg);
        return 0;
    case KEY_REMOTE: {
        char why[256];
        if (remote_opts_apply(&o->remote, arg, why, sizeof why) < 0 && !o->remote_bad)
            o->remote_bad = strdup(why);
        return 0;
    }
    default:
        return 1; /* FUSE and mount options go on to libfuse */
    }
}

/* The numeric options, checked before anything is opened. */
typedef struct numbers {
    unsigned readahead_kb;
    unsigned max_threads;
    unsigned spin_us;
    double timeout;
} numbers;

enum { MAX_THREADS_LIMIT = 1024, READAHEAD_KB_LIMIT = 1 << 20, SPIN_US_LIMIT = 100000 };

static bool parse_numbers(const options *o, numbers *n) {
    if (!parse_uint_option(o->m.max_threads, 1, MAX_THREADS_LIMIT, &n->max_threads)) {
        msg_error(NULL, "max_threads=%s: expected a whole number from 1 to %d", o->m.max_threads,
                  MAX_THREADS_LIMIT);
        return false;
    }
    if (!parse_uint_option(o->readahead_kb, 0, READAHEAD_KB_LIMIT, &n->readahead_kb)) {
        msg_error(NULL, "readahead_kb=%s: expected a whole number of KiB from 0 to %d",
                  o->readahead_kb, READAHEAD_KB_LIMIT);
        return false;
    }
    if (!parse_uint_option(o->spin_us, 0, SPIN_US_LIMIT, &n->spin_us)) {
        msg_error(NULL, "spin_us=%s: expected a whole number of microseconds from 0 to %d",
                  o->spin_us, SPIN_US_LIMIT);
        return false;
    }
    if (!parse_seconds_option(o->timeout, &n->timeout)) {
        msg_error(NULL,
                  "timeout=%s: expected a number of seconds, 0 or more (such as "
                  "86400 or 0.5)",
                  o->timeout);
        return false;
    }
    return true;
}

/* -o uid=, gid=, umask= (as sshfs, rclone and squashfuse take them) into fs. */
static bool owner_options(const options *o, ckptfs *fs) {
    char *end;
    if (o->uid) {
        errno = 0;
        unsigned long v = strtoul(o->uid, &end, 10);
        if (errno || *end || !o->uid[0] || v >= (uid_t)-1) {
            msg_error(NULL, "uid=%s: expected a numeric user id", o->uid);
            return false;
        }
        fs->uid = (uid_t)v;
    }
    if (o->gid) {
        errno = 0;
        unsigned long v = strtoul(o->gid, &end, 10);
        if (errno || *end || !o->gid[0] || v >= (gid_t)-1) {
            msg_error(NULL, "gid=%s: expected a numeric group id", o->gid);
            return false;
        }
        fs->gid = (gid_t)v;
    }
    if (o->umask) {
        errno = 0;
        unsigned long v = strtoul(o->umask, &end, 8);
        if (errno || *end || !o->umask[0] || v > 0777) {
            msg_error(NULL, "umask=%s: expected octal mode bits such as 022 or 077", o->umask);
            return false;
        }
        fs->umask = (mode_t)v;
    }
    return true;
}

/* -o stage=OUT: `ckptfs stage OUT MOUNTPOINT --from SOURCE` in the form mount(8) and fstab
 * use. SOURCE `none` (or "", or left out) stages an empty tree. */
static int mount_stage(options *o, const numbers *num, struct fuse_args *args) {
    if (!o->stage[0]) {
        msg_error(NULL, "-o stage= needs OUT, the archive to write");
        return EXIT_USAGE;
    }
    if (o->m.first && !o->m.mountpoint) { /* `ckptfs MOUNTPOINT -o stage=OUT` */
        o->m.mountpoint = o->m.first;
        o->m.first = NULL;
    }
    if (!o->m.mountpoint || o->m.extra_args) {
        msg_error(NULL, "-o stage=OUT expects SOURCE MOUNTPOINT (SOURCE none for an "
                        "empty stage; try: ckptfs --help)");
        return EXIT_USAGE;
    }
    if (o->read_only_opt) {
        msg_error(NULL,
                  "-o %s is an option of read-only mounts; a staging mount "
                  "(-o stage=OUT) does not take it",
                  o->read_only_opt);
        return EXIT_USAGE;
    }
    if (o->ro) {
        msg_error(NULL, "-o ro: a staging mount (-o stage=OUT) is writable");
        return EXIT_USAGE;
    }
    bool empty = !o->m.first || !o->m.first[0] || strcmp(o->m.first, "none") == 0;
    stage_request req = {.out = o->stage,
                         .mountpoint = o->m.mountpoint,
                         .from = empty ? NULL : o->m.first,
                         .spool = o->spool,
                         .max_shard_size = o->max_shard_size,
                         .max_threads = o->m.max_threads ? num->max_threads : 0,
                         .nocommit = o->nocommit,
                         .foreground = o->m.foreground,
                         .single = o->m.single};
    return stage_mount(&req, args);
}

typedef struct ready_args {
    unsigned readahead_kb;
    passthrough_mode passthrough;
} ready_args;

/* Once the kernel has our INIT reply: raises the mount's readahead (else it is clamped back),
 * and refuses the mount if passthrough=on and the kernel did not take it. */
static int on_mount_ready(void *ctx, dev_t dev) {
    const ready_args *ra = ctx;
    if (ra->readahead_kb) set_mount_readahead(dev, ra->readahead_kb);
    const char *why = passthrough_refused();
    if (ra->passthrough == PASSTHROUGH_ON && why) {
        fprintf(stderr, "ckptfs: passthrough=on: %s\n", why);
        return EXIT_MOUNT;
    }
    return 0;
}

int mount_main(int argc, char **argv) {
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    options o = {.npy = 1};
    numbers num = {.readahead_kb = 1024, .max_threads = 8, .spin_us = 100, .timeout = 86400};
    ckptfs fs = {.timeout = num.timeout, .uid = getuid(), .gid = getgid()};
    pthread_mutex_init(&fs.doc_lock, NULL);
    pthread_mutex_init(&fs.stats_lock, NULL);
    pthread_mutex_init(&fs.backing_lock, NULL);
    struct fuse_session *se = NULL;
    int status = EXIT_USAGE;
    char mnt[PATH_MAX];
    ckpt_err err = {{0}};
    ckpt_hfview view = {0};
    uint64_t max_shard = CKPT_HF_MAX_SHARD_DEFAULT;

    if (fuse_opt_parse(&args, &o, option_spec, on_option) != 0) goto out;
    if (o.m.help || o.version) {
        if (o.m.help)
            usage(stdout);
        else
            printf("ckptfs %s (libfuse %s)\n", ckpt_version(), fuse_pkgversion());
        status = 0;
        goto out;
    }
    if (!parse_numbers(&o, &num)) goto out;
    if (o.stage) {
        status = mount_stage(&o, &num, &args);
        goto out;
    }
    if (o.staging_opt) {
        msg_error(NULL, "-o %s is an option of staging mounts (add -o stage=OUT)", o.staging_opt);
        goto out;
    }
    if (o.remote_bad) {
        msg_error(NULL, "%s", o.remote_bad);
        goto out;
    }
    if (!o.m.first || !o.m.mountpoint || o.m.extra_args) {
        msg_error(NULL, "expected SOURCE and MOUNTPOINT (try: ckptfs --help)");
        goto out;
    }
    if (!realpath(o.m.mountpoint, mnt)) {
        msg_error(NULL, "mount point %s: %s", o.m.mountpoint, strerror(errno));
        goto out;
    }
    if (!mountpoint_usable("ckptfs", mnt)) {
        status = EXIT_MOUNT;
        goto out;
    }
    if (!mountpoint_apart("ckptfs", mnt, o.m.first, NULL)) goto out;
    if (parse_size_option(o.max_shard_size, &max_shard) != 0) {
        msg_error(NULL, "max_shard_size=%s: expected a size such as 5GB, 500MB, 2GiB",
                  o.max_shard_size);
        status = EXIT_USAGE;
        goto out;
    }
    if (o.as_dtype && strcmp(o.as_dtype, "f32") != 0) {
        msg_error(NULL, "as_dtype=%s: only as_dtype=f32 is supported", o.as_dtype);
        status = EXIT_USAGE;
        goto out;
    }
    if (!owner_options(&o, &fs)) goto out;
    if (o.log && mount_log_file(o.log) != 0) {
        msg_error(NULL, "log=%s: %s", o.log, strerror(errno));
        status = EXIT_USAGE;
        goto out;
    }
    fs.as_f32 = o.as_dtype != NULL;
    passthrough_mode pmode;
    if (!passthrough_parse_mode(o.passthrough, &pmode)) {
        msg_error(NULL, "passthrough=%s: expected auto, off or on", o.passthrough);
        status = EXIT_USAGE;
        goto out;
    }
    fs.passthrough = pmode != PASSTHROUGH_OFF;
    bool hf_root = false, gguf_root = o.view && strcmp(o.view, "gguf") == 0;
    if (o.view && !gguf_root && !(hf_root = strcmp(o.view, "hf") == 0) &&
        strcmp(o.view, "tree") != 0) {
        msg_error(NULL, "view=%s: expected view=tree, view=hf or view=gguf", o.view);
        status = EXIT_USAGE;
        goto out;
    }
    if (o.gguf_type && !gguf_root) {
        msg_error(NULL, "gguf_type=%s goes with view=gguf", o.gguf_type);
        status = EXIT_USAGE;
        goto out;
    }
    if ((hf_root || gguf_root) && fs.as_f32) {
        msg_error(NULL,
                  "as_dtype=f32 converts the files of the tensor tree; view=%s shows none (its "
                  "file keeps the stored bytes)",
                  o.view);
        status = EXIT_USAGE;
        goto out;
    }
    fs.timeout = num.timeout;
    fs.splice = o.splice != 0;
    fs.readahead_kb = num.readahead_kb;
    status = EXIT_SOURCE;
    ckpt_options copts = {.tp_split = o.tp_split, .revision = o.revision, .remote = o.remote.o};
    heap_for_loading();
    if (ckpt_open(o.m.first, &copts, &fs.cat, &err) != 0) {
        msg_error(NULL, "%s", err.msg);
        goto out;
    }
    if (!mountpoint_apart("ckptfs", mnt, o.m.first, fs.cat)) {
        status = EXIT_USAGE;
        goto out;
    }
    /* Loading is over: what parsing left free goes back now, before the tree and the view are
     * built. Big blocks are then served from those free pages, and pages once touched stay
     * resident, so the heap is trimmed again after each big scratch table: at a million
     * tensors these trims lower a mount's peak by about 70 MB. */
    heap_for_serving();
    if (gguf_root) { /* the catalog becomes the one laid out for llama.cpp, as convert's */
        char *note = NULL;
        if (ckpt_gguf_view_build(&fs.cat, o.gguf_type, &view, &note, &err) != 0) {
            msg_error(NULL, "view=gguf: %s", err.msg);
            goto out;
        }
        if (note) msg_error(NULL, "view=gguf: note: %s", note);
        free(note);
        hf_root = true; /* its file at the root, as view=hf's */
    }
    fs.view_at_root = hf_root;
    if ((fs.alias = calloc(fs.cat->ntensors ? fs.cat->ntensors : 1, sizeof *fs.alias)))
        ckpt_mark_aliases(fs.cat, fs.alias);
    heap_for_serving(); /* the alias table's scratch (32 bytes a tensor) */
    view_job job;
    if (gguf_root)
        view_job_ready(&job, &view);
    else
        view_job_start(&job, fs.cat, max_shard, &view);
    if (tree_build(&fs.tr, fs.cat, view_job_wait, &job, hf_root, o.npy != 0, fs.as_f32, &err) !=
        0) {
        char src[PATH_MAX];
        ckpt_shown_name(o.m.first, src, sizeof src);
        msg_error(NULL, "%s: %s", src, err.msg);
        goto out;
    }
    heap_for_serving(); /* the tree's */

    if (!o.subtype) fuse_opt_add_arg(&args, "-osubtype=ckptfs");
    char *fsname = NULL, shown[PATH_MAX];
    ckpt_shown_name(o.m.first, shown, sizeof shown); /* /proc/mounts is world-readable */
    if (!o.fsname && fuse_opt_add_opt_escaped(&fsname, shown) == 0) {
        char *opt = malloc(strlen(fsname) + 10);
        if (opt) {
            sprintf(opt, "-ofsname=%s", fsname);
            fuse_opt_add_arg(&args, opt);
            free(opt);
        }
        free(fsname);
    }
    if (o.m.allow_other) fuse_opt_add_arg(&args, "-odefault_permissions");
    fuse_opt_add_arg(&args, "-oro"); /* last, so a "rw" from a mount helper cannot win */

    status = EXIT_USAGE; /* fuse_session_new fails on unknown options */
    se = fuse_session_new(&args, &ckptfs_ops, sizeof ckptfs_ops, &fs);
    fs.se = se;
    if (!se) goto out;
    status = EXIT_MOUNT;
    if (fuse_set_signal_handlers(se) != 0) goto out_session;
    if (fuse_session_mount(se, mnt) != 0) goto out_handlers;
    if (fs.passthrough &&
        (!(fs.backing = calloc(fs.cat->nsources ? fs.cat->nsources : 1, sizeof *fs.backing)) ||
         passthrough_install(se, pmode) != 0)) {
        fprintf(stderr, "ckptfs: passthrough: cannot hook the FUSE device\n");
        goto out_unmount;
    }
    if (!o.m.foreground && daemon_detach(EXIT_MOUNT) != 0) {
        msg_error(NULL, "cannot detach: %s", strerror(errno));
        goto out_unmount;
    }
    if (!o.m.foreground) mount_log_detached();
    changed_init(fs.cat);
    serve_opts so = {.single = o.m.single != 0,
                     .max_threads = num.max_threads,
                     .spin_us = num.spin_us,
                     .inline_ops = loop_metadata_ops()};
    ready_args ra = {.readahead_kb = num.readahead_kb, .passthrough = pmode};
    int loop = daemon_serve(se, mnt, &so, on_mount_ready, &ra);
    /* libfuse reports the signal that ended the loop: an unmount by signal is a clean exit. */
    status = loop == 0 || loop == SIGTERM || loop == SIGINT || loop == SIGHUP ? 0 : EXIT_MOUNT;
out_unmount:
    fuse_session_unmount(se);
out_handlers:
    fuse_remove_signal_handlers(se);
out_session:
    fuse_session_destroy(se);
out:
    daemon_report_ready(status ? (unsigned char)status : EXIT_MOUNT);
    fuse_opt_free_args(&args);
    for (int d = 0; d < DOC_COUNT; d++) free(fs.docs[d]);
    ckptfs_free_open_docs(&fs);
    free(fs.sha256);
    free(fs.stats);
    free(fs.stats_known);
    ckpt_stats_pages_free(fs.stats_pages);
    changed_free();
    ckpt_tsv_pages_free(fs.tsv_pages);
    free(fs.alias);
    tree_free(&fs.tr);
    ckpt_hfview_free(&view);
    ckpt_close(fs.cat);
    free(o.view);
    free(o.gguf_type);
    free(o.readahead_kb);
    free(o.spin_us);
    free(o.timeout);
    free(o.max_shard_size);
    free(o.tp_split);
    free(o.revision);
    remote_opts_free(&o.remote);
    free(o.remote_bad);
    free(o.as_dtype);
    free(o.passthrough);
    free(fs.backing);
    free(o.stage);
    free(o.spool);
    free(o.read_only_opt);
    free(o.staging_opt);
    free(o.uid);
    free(o.gid);
    free(o.log);
    free(o.umask);
    mount_opts_free(&o.m);
    return status;
}
