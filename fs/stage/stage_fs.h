/* The staging mount: a writable tree held in memory, whose file bytes live in a spool directory
 * on disk and whose every change is appended to a journal there, so a killed daemon loses
 * nothing: `ckptfs stage` over the same OUT replays the journal.
 *
 *   stage_tree.c    the in-memory tree (nodes, directory tables, paths)
 *   stage_spool.c   the spool: lock, state, data files, the source's tree, clean-up
 *   stage_journal.c the journal: records, replay, snapshot (it uses the spool, not the reverse)
 *   stage_ops.c     the FUSE operations on names and attributes (stage_ops.h)
 *   stage_io.c      the FUSE operations on contents: open, read, write, copy-up, control files
 *   stage_commit.c  commit (validate + ckpt_write) and the .ckptfs/status document
 *   stage_rebase.c  after a commit that replaced the stage's own source: onto the new one
 *   stage_pack.c    staged tensors appended to the file that becomes a safetensors OUT
 *   stage_pack_dir.c  a directory OUT whose shards are such files
 *   stage_pack_whole.c  files of the --from source a directory OUT links as shards
 *   stage_pack_clone.c  a safetensors OUT as a clone of the source's file (FICLONE)
 *   stage_status.c  `ckptfs stage --status OUT`
 *   stage.c         `ckptfs stage` (options, spool + journal at start, mount, commit on unmount)
 *   stage_client.c  `ckptfs commit MOUNTPOINT` */
#ifndef CKPTFS_STAGE_FS_H
#define CKPTFS_STAGE_FS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "core/ckpt.h"
#include "core/util/hashmap.h"
#include "core/util/strbuf.h"
#include "core/util/text.h"

typedef enum {
    SN_DIR,
    SN_FILE,
    SN_CONTROL_DIR, /* .ckptfs/ at the root: not part of the staged tree */
    SN_COMMIT,      /* .ckptfs/commit: a write commits, a read gives that commit's report */
    SN_STATUS,      /* .ckptfs/status: JSON about the stage and the last commit */
} sn_kind;

typedef enum {
    SRC_SPOOL,         /* bytes in spool/data/<data_id> */
    SRC_LOWER_RAW,     /* raw bytes of source tensor `lower`, not copied */
    SRC_LOWER_SIDECAR, /* the sidecar of source tensor `lower`, generated */
    SRC_PACK,          /* bytes [pack_off, pack_off + pack_size) of the pack spool/data/<data_id> */
} sn_src;

typedef struct snode snode;
struct snode {
    snode *parent; /* NULL for the root and for nodes taken out of the tree */
    char *name;    /* NUL-terminated: FUSE names never hold a NUL */
    size_t name_len;
    snode *hash_next; /* next in the parent's bucket */
    sn_kind kind;
    mode_t mode; /* permission bits */
    struct timespec mtime;
    /* SN_DIR: children in a chained hash table */
    snode **buckets;
    size_t nbuckets, nchildren;
    /* SN_FILE */
    sn_src src;
    uint64_t data_id;             /* SRC_SPOOL, SRC_PACK */
    uint64_t pack_off, pack_size; /* SRC_PACK */
    size_t lower;                 /* SRC_LOWER_*: tensor index in the source catalog */
    uint64_t lower_size;
    int fd;         /* SRC_SPOOL, SRC_PACK: open while nopen > 0, else -1 */
    unsigned nopen; /* open file handles */
    uint64_t nlookup;
    bool removed;   /* unlinked: freed once the kernel forgets it and no handle is open */
    int late_error; /* a write answered before it was made failed (stage_io.c): its errno */
    /* while removed but alive: on the stage's list of such nodes, freed at its end at the
     * latest (the kernel need not send FORGET before the connection ends) */
    snode *removed_next, **removed_prev;
};

typedef struct stage {
    char *out;        /* absolute; as ckpt_write takes it */
    char *from;       /* absolute path of the source checkpoint, or NULL */
    char *spool;      /* absolute path of the spool directory */
    char *mountpoint; /* absolute */
    ckpt_catalog *lower;
    ckpt_catalog **retired; /* sources replaced by our own commits, open until the end */
    size_t nretired;
    uid_t uid;
    gid_t gid;
    double timeout;
    uint64_t max_shard_size;

    int spool_fd, data_fd, lock_fd, journal_fd;
    uint64_t next_id;

    /* The pack (stage_pack.c): one file in data/ that new tensor files are appended to while
     * one of them at a time owns its tail; a commit writes the header in front and links it
     * as OUT. */
    int pack_usable;   /* PACK_* of stage_pack.h: not known yet, none, one file, a directory */
    int pack_fd;       /* the pack being appended to, or -1 */
    uint64_t pack_id;  /* its data id */
    uint64_t pack_end; /* where the next file starts */
    snode *pack_tail;  /* the file being appended, or NULL */
    bool no_clone;     /* FICLONE refused here: commits do not try it again */

    pthread_mutex_t lock; /* the tree, the journal, dirty, last report */
    snode *root;
    snode *removed; /* nodes out of the tree that the kernel or a handle still refers to */
    snode control, commit_node, status_node;
    atomic_bool dirty; /* changes not yet in OUT (written under lock) */
    /* taken up after a kill of a commit that had replaced its own source (--from OUT) once
     * OUT was in place: the stage goes on over the new OUT with nothing changed */
    bool landed;

    /* Changes hold the gate for reading (trylock: EBUSY during a commit); a commit holds it
     * for writing, so it packs a tree nobody changes under it. */
    pthread_rwlock_t gate;
    pthread_mutex_t commit_lock; /* one commit at a time */
    atomic_bool committing;
    atomic_uint commit_threads; /* commits running on threads of their own (stage_io.c) */
    _Atomic uint64_t progress_done, progress_total;
    char *last_report; /* "exit N\n..." of the last commit, or NULL */
    pthread_mutex_t handles_lock;
    struct handle *handles; /* open file handles (stage_io.c) */
    /* Writes into the pack are answered first and made after (stage_io.c), in the order they
     * were answered: ticket wb_next is the next one given, wb_done counts those made. */
    pthread_mutex_t wb_lock;
    pthread_cond_t wb_cond;
    uint64_t wb_next, wb_done;
} stage;

enum { STAGE_OK = 0, STAGE_USAGE = 1, STAGE_INVALID = 2, STAGE_WRITE_FAILED = 3 };

/* ---- stage_tree.c (callers hold st->lock) ---- */
snode *snode_new(sn_kind kind, const char *name, size_t len, mode_t mode);
void snode_free(snode *n);
/* Frees n and everything under it; nodes the kernel may still know must not be passed. */
void snode_free_tree(snode *n);
snode *tree_child(const snode *dir, const char *name, size_t len);
int tree_attach(snode *dir, snode *child);
void tree_detach(snode *child);
/* The directory `name` in parent, made (mode 0755) if missing; NULL if a file is in the way
 * or out of memory. */
snode *tree_ensure_dir(snode *parent, const char *name, size_t len);
/* Moves n under new_parent as `name` (the caller removed whatever had that name). */
int tree_rename(snode *n, snode *new_parent, const char *name, size_t len);
/* "a/b/c" relative to the root ("" for the root). */
void tree_path(const snode *n, strbuf *sb);
/* The node at a relative path, or NULL. */
snode *tree_resolve(snode *root, const char *path, size_t len);
bool tree_is_ancestor(const snode *ancestor, const snode *n);
/* A removed node nobody refers to any more is freed. */
void tree_release_if_unused(snode *n);

/* ---- stage_spool.c ---- */
/* Creates or takes over the spool (lock, state), opens the source, loads its tree. *resumed
 * says whether an earlier stage's data was found; *lower_paths (the caller frees it on success)
 * maps a source path to 2 * tensor (+1 for a sidecar), for journal_restore. Messages go to
 * stderr; returns 0 or an exit status. */
int spool_setup(stage *st, const char *from_arg, bool *resumed, hashmap *lower_paths);
/* Once the journal is restored: data files no node refers to, temporaries of a killed commit
 * go; the last commit's report is loaded. */
void spool_tidy(stage *st, bool resumed);
/* A commit links and unlinks files of its sources itself (a shard taken whole, the pack that
 * becomes OUT, the old OUT it replaces), and so does a stage tidying its spool (a pack that is
 * also a shard of OUT): that moves their ctime, which readers take for a change in place.
 * Between begin and end, ctime is not compared for the sources of every catalog the stage
 * reads (the lower one, those retired by earlier commits, cat if not NULL); at the end it is
 * recorded again. A change in place that puts mtime back in that window is the one not seen:
 * size and mtime are still compared. */
void stage_own_ctime_change(stage *st, ckpt_catalog *cat, bool begin);
void spool_close(stage *st);
/* Rewrites SPOOL/state for st->lower as it is now (after a commit replaced the source). */
int spool_write_state(stage *st);
/* Writes the daemon's pid into SPOOL/lock (for messages, and for tests that must find it). */
void spool_note_pid(stage *st);
/* At the daemon's end, SPOOL/lock says how the stage ended instead of its pid: "done N"
 * (committed, or nothing to commit), "failed N" (the commit's exit status) or "nocommit N". */
void spool_note_outcome(stage *st, const char *what, int status);
/* After a final successful commit: the spool's files and directory go away. */
void spool_remove(stage *st);
/* A commit that replaces the stage's own source (--from OUT) is about to put the file or
 * directory `what` (stat of it) in place as OUT: SPOOL/landing says so, so that a stage taken
 * up after a kill from then on knows the new OUT as its own commit (the source's fingerprint
 * no longer matches the state). 0 or -errno. */
int spool_note_landing(stage *st, const struct stat *what);
/* The commit ended (and the state names the new source, or OUT was not replaced). */
void spool_clear_landing(stage *st);
/* Replaces SPOOL/name with text (temporary file, fsync, rename). */
int spool_write_file(stage *st, const char *name, const char *text, size_t len);
void spool_data_name(uint64_t id, char out[17]);
int spool_data_path(const stage *st, uint64_t id, strbuf *sb);
/* A new empty data file: returns an fd (O_RDWR), or a negative errno. */
int spool_data_create(stage *st, uint64_t *id);
int spool_data_open(const stage *st, uint64_t id);
int spool_data_stat(const stage *st, uint64_t id, struct stat *s);
void spool_data_unlink(const stage *st, uint64_t id);
bool spool_parse_id(const char *s, uint64_t *id);

/* ---- stage_journal.c ---- */
/* Paths in the journal and the state file: text_pct_escape with space (bytes <= 0x20, 0x7F, '%').
 */
/* Applies SPOOL/journal to the tree; lower_paths maps the path of a source tensor's raw file
 * to the tensor (its sidecar is found from it). Returns 0 or a negative errno (a journal that is
 * not ours). */
int journal_replay(stage *st, const hashmap *lower_paths);
/* Rewrites the journal as a snapshot of the tree and reopens it for appending. */
int journal_snapshot(stage *st);
/* At start: replays the journal of a resumed stage onto the tree spool_setup loaded, then
 * starts the journal afresh from a snapshot. Messages go to stderr; 0 or an exit status. */
int journal_restore(stage *st, bool resumed, const hashmap *lower_paths);
/* Records (under st->lock). Each returns 0 or a negative errno. */
int journal_dir(stage *st, const snode *n);
int journal_file(stage *st, const snode *n);
int journal_remove(stage *st, const snode *n);
int journal_rename(stage *st, const snode *n, const snode *new_parent, const char *new_name);
int journal_mode(stage *st, const snode *n);
int journal_mark(stage *st, char mark);            /* 'C' committed, 'w' changed */
int journal_pack(stage *st, const snode *n);       /* a file in the pack: its start */
int journal_pack_size(stage *st, const snode *n);  /* its final size */
int journal_pack_moved(stage *st, const snode *n); /* a closed file, now at its start and size */
int journal_sync(stage *st);

/* ---- stage_paths.c ---- */
/* OUT made absolute (its directory must exist), keeping a trailing '/' that asks for an HF
 * directory; NULL after saying on stderr why OUT cannot be staged. malloc'd. */
char *stage_out_path(const char *out);
/* The spool of an absolute OUT: -o spool=DIR as opt (its parent must exist), or NULL for
 * .NAME.stage next to OUT; NULL after saying why on stderr. malloc'd. */
char *stage_spool_path(const char *out_abs, const char *opt);

/* ---- stage_ops.c ---- */
extern const struct fuse_lowlevel_ops stage_ops;

/* ---- stage_copy_up.c ---- */
/* Reads bytes of a source tensor's raw file: 0, or a positive errno. */
int stage_read_lower(const ckpt_catalog *cat, size_t tensor, uint64_t off, size_t len, char *buf,
                     size_t *got);
/* Copies the first `keep` bytes of a node that refers to the source (or the pack) into a new
 * data file, which the node then refers to, n->fd left open for the caller. Under st->lock
 * and the gate. 0 or a positive errno. */
int stage_copy_up_keep(stage *st, snode *n, uint64_t keep);
/* All of it, and n->fd closed again when nobody has the file open: 0 or an errno. */
int stage_copy_up(stage *st, snode *n);
/* Closes a data file nobody has open any more. */
void stage_settle_fd(snode *n);

/* ---- stage_commit.c ---- */
/* Validates the staged tree and writes OUT. Returns STAGE_OK / STAGE_INVALID /
 * STAGE_WRITE_FAILED; *report (malloc'd) is "exit N\n" + a summary line + one line per
 * problem. */
int stage_commit(stage *st, char **report);
/* ---- stage_rebase.c ---- */
struct staged_report;
/* True when a commit replaces the stage's own source (--from OUT). */
bool stage_replaces_source(const stage *st);
/* After such a commit (under st->lock): the stage's source becomes the new OUT. nodes[k] is
 * the node of staged file k of the commit's report. Notes go to report; 0 or -errno. */
int stage_rebase(stage *st, snode *const *nodes, size_t n, const struct staged_report *rep,
                 strbuf *report);

/* ---- stage_pack_live.c (under st->lock) ---- */
enum { PACK_DATA_START = 1 << 20 }; /* bytes reserved for the 8-byte length and the header */
/* Makes the new empty file n (named `name`) a file of the pack that owns its tail: 0, or a
 * positive errno (ENOTSUP: the pack is not for this file; it takes a data file instead). */
int stage_pack_claim(stage *st, snode *n, const char *name);
/* Whether a file of this name may go into the pack (one that can be a tensor's raw bytes). */
bool stage_pack_name_ok(const char *name);
/* The owner of the tail is done (closed, or a commit begins): its size is journaled. */
void stage_pack_seal(stage *st);
/* n was removed or moved out of the pack: if its bytes end the pack, they come off. */
void stage_pack_drop_tail(stage *st, snode *n);
/* Whether a write to n must first move it out of the pack (a file that no longer owns it). */
bool stage_pack_writable(const stage *st, const snode *n);
/* After a write of `end` bytes into n (the owner). */
void stage_pack_grew(stage *st, snode *n, uint64_t end);
/* Commits cat into OUT through the pack: 0 done, 1 not possible (holes, a header too big,
 * another OUT format: the caller writes OUT as usual), or -errno with err filled. A directory
 * OUT is made of packs too, each a shard (stage_pack_dir.c). */
struct ckpt_err;
int stage_pack_commit(stage *st, ckpt_catalog *cat, const ckpt_write_opts *opts, ckpt_err *err);

/* The .ckptfs/status document (malloc'd JSON). */
char *stage_status_json(stage *st, size_t *len);

#endif
