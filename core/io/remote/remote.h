/* Remote sources: objects behind http(s)://, s3:// and hf:// names, read through the block
 * cache, pinned (size, ETag) when opened, and listed as directories. What catalog.c, source.c
 * and place.c call; nothing above core/ sees this header. */
#ifndef CKPT_REMOTE_H
#define CKPT_REMOTE_H

#include "../../ckpt.h"
#include "../../util/strbuf.h"
#include "http.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct remote_object remote_object;

/* One kind of remote name, as curl's protocol handlers are: a row of the table in schemes.c
 * says what a name of it requests, how its directories are listed and its names pinned, and
 * what its listings can be trusted for. A new kind of store is a row and its functions. */
typedef struct remote_target remote_target;
typedef struct remote_entry remote_entry;
typedef struct remote_scheme {
    const char *prefix; /* "s3://" */
    /* The URL a name requests and how to authenticate (t->url is initialized, empty). */
    int (*target)(const char *path, remote_target *t, ckpt_err *err);
    /* The entries of one directory level, in any order. */
    int (*list)(const char *dir, remote_entry **out, size_t *n, ckpt_err *err);
    /* The name pinned to what it points at now (the Hub: a revision's commit) into out; NULL:
     * a name is its own pin (normalized). */
    int (*pin)(const char *path, char *out, size_t cap, ckpt_err *err);
    /* The name as messages show it (no secrets); NULL: as it is. */
    void (*shown)(const char *path, char *out, size_t cap);
    /* What one name is when its parent is no listed directory: REMOTE_FILE, REMOTE_DIR,
     * REMOTE_MISSING, or -1 to look in the parent's listing; NULL: always the listing. */
    int (*kind)(const char *path);
    /* Names of at most this many components after scheme://authority are directories (a
     * bucket: 0, a Hub repo ORG/NAME@REV: 1); -1: none is known to be (a server's top). */
    int top_dirs;
    /* A listing may leave names out (index pages hide dot files) and one that failed says
     * nothing: such names are asked for with kind. */
    bool partial_listings;
} remote_scheme;

/* The scheme of a name (by its prefix), or NULL when it is no URL. */
const remote_scheme *remote_scheme_of(const char *path);
/* http://, https://, s3:// or hf://: a name with a scheme. */
bool remote_is_url(const char *path);
/* Applies the mount's options (cache, endpoints, timeouts); the first call wins for the
 * process-wide parts (cache folder, workers). */
int remote_configure(const ckpt_remote_options *o, ckpt_err *err);

/* Opens and pins the object (size, ETag, modification time) with one ranged GET that also
 * caches its first block. */
int remote_open(const char *path, remote_object **out, ckpt_err *err);
void remote_close(remote_object *o);
/* One more owner of o (a tar member reads its archive's object): remote_close once per hold. */
remote_object *remote_hold(remote_object *o);
uint64_t remote_size(const remote_object *o);
time_t remote_mtime(const remote_object *o);
/* Up to len bytes at off: the count, 0 at the end, or a negative errno (EIO once the object is
 * seen changed). remote_last_error() says why, for this thread's last failure. */
ssize_t remote_pread(remote_object *o, void *buf, size_t len, uint64_t off);
/* [off, off+len) of o appended to v as pointers into its cached blocks (fetched if need be):
 * 1, 0 when they need more pieces than v has left (v unchanged), or a negative errno (v
 * unchanged; remote_last_error() says why). */
int remote_view(remote_object *o, uint64_t off, size_t len, ckpt_view *v);
void remote_unview(void *hold);
bool remote_changed(const remote_object *o);
const char *remote_last_error(void);
/* Where the object's parts start (tensor data offsets, any order; hard[i]: a tar member's end,
 * hard may be NULL): a reader's prefetch stops at the next one after it, so reading one tensor
 * to its end fetches (almost) nothing of the next. A reader that has read across a part's start
 * reads more than one tensor: its prefetch stops only at hard ones. */
void remote_set_boundaries(remote_object *o, const uint64_t *offsets, const bool *hard, size_t n);
/* Opens these objects in parallel (a mount's shards); remote_open then finds them ready. */
void remote_warm(const char *const *paths, size_t n);

/* Where a name points: the URL to request and how to authenticate. */
struct remote_target {
    strbuf url;            /* the request URL (may hold secrets: never shown) */
    const http_auth *auth; /* NULL: anonymous */
    const char *hint;      /* for a host that cannot be reached (http_req.hint), or NULL */
};
int remote_target_of(const char *path, remote_target *t, ckpt_err *err);
static inline void remote_target_free(remote_target *t) {
    sb_free(&t->url);
}

/* Directories. */
struct remote_entry {
    char *name;
    bool dir;
    uint64_t size; /* of a file, or REMOTE_SIZE_UNKNOWN (an http index page) */
};
#define REMOTE_SIZE_UNKNOWN UINT64_MAX
enum { REMOTE_MISSING, REMOTE_FILE, REMOTE_DIR };
/* REMOTE_FILE, REMOTE_DIR or REMOTE_MISSING (also when it cannot be told). */
int remote_kind(const char *path);
/* The entries of a directory, sorted by name. *out belongs to the listing cache. */
int remote_list(const char *dir, const remote_entry **out, size_t *n, ckpt_err *err);
/* The name a catalog's root shows, pinned (remote_scheme.pin) or normalized, into out. */
int remote_pin(const char *path, char *out, size_t cap, ckpt_err *err);
/* A path with "." and ".." components resolved, as realpath would for a local one. */
int remote_normalize(const char *path, char *out, size_t cap);
/* A name as every message, summary and sidecar shows it: no user:password@, no ?query. */
void remote_shown(const char *path, char *out, size_t cap);

/* Scheme-specific parts (s3.c, hf.c, httpdir.c): listing one directory level. */
int s3_target(const char *path, remote_target *t, ckpt_err *err);
int s3_list(const char *dir, remote_entry **out, size_t *n, ckpt_err *err);
/* REMOTE_FILE, REMOTE_DIR or REMOTE_MISSING of s3://BUCKET/KEY, from two one-key listings; -1
 * when the store refused them (s3rver answers a truncated one-key page with a 500). */
int s3_kind(const char *path);
int hf_target(const char *path, remote_target *t, ckpt_err *err);
int hf_list(const char *dir, remote_entry **out, size_t *n, ckpt_err *err);
/* Pins hf://org/name[@rev][/path] to a commit: the same name with @<sha> (in out). */
int hf_pin(const char *path, char *out, size_t cap, ckpt_err *err);
int httpdir_list(const char *dir, remote_entry **out, size_t *n, ckpt_err *err);
/* What a HEAD of url says it is (kept: the directory probes ask for the same names again). */
int httpdir_kind(const char *url);
/* http(s) names (http_names.c): the real URL (user:password@ and ?query put back) and the
 * shown name. */
int http_target(const char *path, remote_target *t, ckpt_err *err);
void http_shown(const char *path, char *out, size_t cap);
void remote_set_s3_options(const ckpt_remote_options *o);

/* Statistics as JSON members (no braces), for .ckptfs/cache.json. */
void remote_stats_json(strbuf *sb);

#endif
