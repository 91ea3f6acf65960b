/* `ckptfs serve SOURCE...`: checkpoints as Hugging Face Hub repositories over HTTP.
 *
 * Each source is a repo `ORG/NAME` (given as ORG/NAME=SOURCE, the id of an HF cache folder, or
 * ckptfs/NAME) whose files are the HF view of the mount (config,
 * model.safetensors or shards + index, tokenizer files) plus the mount's tensor tree under
 * tensors/. A repo holds a snapshot: the catalog, its HF view and the mount's tree, built by the
 * same code as the FUSE mount. When a source changes on disk a new snapshot replaces it; requests
 * in flight keep the one they started with. */
#ifndef CKPTFS_SERVE_H
#define CKPTFS_SERVE_H

#include "core/ckpt.h"
#include "core/views/hfview.h"
#include "core/views/tree.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum {
    SERVE_SHA_HEX = 40,                    /* a git commit id, as Hub clients expect */
    SERVE_NAME_MAX = 96,                   /* repo names: [A-Za-z0-9._-], as the Hub allows */
    SERVE_ID_MAX = 2 * SERVE_NAME_MAX + 1, /* a repo id: ORG/NAME */
    SERVE_NODE_NONE = UINT32_MAX,          /* no such file */
    SERVE_NODE_ROOT = UINT32_MAX - 1,      /* the repo's top directory (the HF view + tensors/) */
};

#define SERVE_TENSORS_DIR "tensors"

typedef struct serve_snapshot {
    atomic_int refs;
    ckpt_catalog *cat;
    ckpt_hfview view;
    tree tr;
    uint32_t hf_dir; /* the tree's .ckptfs/hf directory, or SERVE_NODE_NONE */
    char sha[SERVE_SHA_HEX + 1];
    time_t modified; /* newest source mtime */
    char *docs[DOC_COUNT];
    size_t doc_len[DOC_COUNT];
    pthread_mutex_t plot_lock; /* the per-layer SVG, drawn on its first request */
    int plot_state;            /* SERVE_PLOT_* */
    char *plot;                /* NULL when done: nothing to draw, or drawing failed */
    size_t plot_len;
    struct MHD_Connection **plot_waiters; /* suspended until it is drawn */
    size_t plot_nwaiters, plot_cap;
    struct serve_etags *etags; /* content digests of the files asked for (serve_etag.c) */
    /* How etags is freed, set by serve_etag.c with the table: the snapshot's owner
     * (serve_repo.c) frees it without calling into serve_etag.c, which calls serve_repo.c's
     * node functions (no loop of calls between the two). */
    void (*etags_free)(struct serve_etags *e);
} serve_snapshot;

enum { SERVE_PLOT_NONE, SERVE_PLOT_DRAWING, SERVE_PLOT_DONE };

typedef struct serve_repo {
    char name[SERVE_ID_MAX + 1]; /* the repo id, ORG/NAME: ckptfs/NAME unless given */
    char *source;                /* as given: may hold a URL's secrets, never shown */
    char *shown;                 /* what pages, listings and messages show (ckpt_shown_name) */
    pthread_mutex_t lock;        /* guards cur, checked, error */
    serve_snapshot *cur;
    double checked;  /* monotonic seconds of the last look at the sources */
    char error[600]; /* why the changed source could not be opened again, or "" */
} serve_repo;

/* Set when no token guards the server: then every source file must be one other users may
 * read anyway (serve_snapshot_open refuses the others). */
extern bool serve_public_only;

/* Opens the source into a snapshot holding one reference. */
int serve_snapshot_open(const char *source, serve_snapshot **out, ckpt_err *err);
void serve_snapshot_put(serve_snapshot *s);
/* The repo's current snapshot with a reference, reopened first when a source changed (looked
 * at most once a second). NULL with why filled when the source changed and cannot be read. */
serve_snapshot *serve_repo_get(serve_repo *r, char *why, size_t why_len);

/* A file or directory of the repo by its path ("" is the top): a tree node, SERVE_NODE_ROOT or
 * SERVE_NODE_NONE. Components "", "." and ".." never match. */
uint32_t serve_lookup(const serve_snapshot *s, const char *path);
/* Whether node i of the tree is shown under tensors/ (.ckptfs/hf and stats.json are not). */
bool serve_node_shown(const serve_snapshot *s, uint32_t i);
/* Whether node i is a file (or folder) of the HF view, below .ckptfs/hf. */
bool serve_in_view(const serve_snapshot *s, uint32_t i);
/* The size of a file node: tree_node_size, or the snapshot's documents' (made at open). */
uint64_t serve_node_size(const serve_snapshot *s, uint32_t i);
/* The repo path of node i into sb (without a trailing slash). */
struct strbuf;
void serve_node_path(const serve_snapshot *s, uint32_t i, struct strbuf *sb);
/* The files the Hub calls siblings: the HF view (aux files and synthesized ones), by name. */
size_t serve_view_files(const serve_snapshot *s, uint32_t **out);

/* The content of a file node as memory, when it is a generated document: the text (owned by
 * the snapshot, or malloc'd into *owned for sidecars), NULL for nodes read through the planner. */
const char *serve_node_text(const serve_snapshot *s, uint32_t i, size_t *len, char **owned);

/* The sha256 of file node's size bytes as hex, computed on the first call for that node of
 * the snapshot (one read of the file) and kept: 0, or a negative errno. */
int serve_content_sha(serve_snapshot *s, uint32_t node, uint64_t size, char *hex);

/* The per-layer SVG (statistics of every tensor, computed once, on a thread of its own: it
 * reads every tensor, and a request thread that drew it would leave the server's other
 * requests waiting). SERVE_PLOT_DONE with *svg (NULL when no tensor has a layer number or
 * drawing failed), or SERVE_PLOT_DRAWING: connection c is suspended, and resumed (its request
 * handled again) once the picture is drawn. -ENOMEM when neither could be done. */
struct MHD_Connection;
int serve_plot(serve_snapshot *s, struct MHD_Connection *c, const char **svg, size_t *len);

/* HTML pages. */
char *serve_html_index(serve_repo *repos, size_t n, size_t *len);
/* host: the request's Host header (for the download command), or NULL. */
char *serve_html_repo(const serve_repo *r, serve_snapshot *s, const char *host, size_t *len);

/* The HTTP side. */
typedef struct serve_config {
    serve_repo *repos;
    size_t nrepos;
    const char *token; /* NULL: no authentication */
    unsigned threads;
    unsigned max_connections;
    unsigned timeout; /* seconds a connection may stay idle */
} serve_config;

struct MHD_Daemon;
/* Starts listening on addr (a sockaddr of addrlen bytes). NULL with a message on failure. */
struct MHD_Daemon *serve_http_start(serve_config *cfg, const void *addr, unsigned addrlen,
                                    char *msg, size_t msg_len);
unsigned serve_http_port(struct MHD_Daemon *d);
void serve_http_stop(struct MHD_Daemon *d);

int serve_main(int argc, char **argv);

#endif
