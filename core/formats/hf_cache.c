/* A Hugging Face hub cache repo folder (~/.cache/huggingface/hub/models--org--name):
 *   refs/main              the commit hash the branch points at (no newline)
 *   snapshots/<commit>/    the files of that commit, symlinks into ../../blobs/<hash>
 *   blobs/<hash>           the bytes
 * Mounting the repo folder mounts the snapshot refs/main names, or the one -o revision= names:
 * a ref (refs/<revision>, which may be "pr/1") or a commit hash that has a snapshot. The
 * snapshot itself is then opened as any model directory; its symlinks are the user's own and
 * are followed like any other file.
 *
 * Remotely (place.h), a repo folder is a listing holding refs/ and snapshots/: a cache copied
 * to a bucket (aws s3 sync uploads what the links point at) or served by a web server that
 * follows links. blobs/ is not needed there: the snapshot's files are the bytes. */
#include "formats.h"

#include "../io/place.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_dir(const char *path) {
    return place_kind(path) == PLACE_DIR;
}

bool hf_cache_probe(const char *dir) {
    char refs[PATH_MAX], snaps[PATH_MAX];
    int a = snprintf(refs, sizeof refs, "%s/refs", dir);
    int b = snprintf(snaps, sizeof snaps, "%s/snapshots", dir);
    if (a <= 0 || (size_t)a >= sizeof refs || b <= 0 || (size_t)b >= sizeof snaps || !is_dir(refs))
        return false;
    /* An object store holds no empty folder: a bucket copy of a cache whose snapshots were
     * left behind has refs/ only, and is still a cache folder (refused naming the snapshot). */
    return is_dir(snaps) || strncmp(dir, "s3://", 5) == 0;
}

/* A revision names something under refs/ or snapshots/: no empty, "." or ".." component, no
 * leading '/', printable ASCII only (it is also shown in messages). */
static bool revision_ok(const char *rev) {
    size_t n = strlen(rev);
    if (n == 0 || n > 255 || rev[0] == '/') return false;
    for (size_t s = 0, i = 0; i <= n; i++) {
        if (i < n && (rev[i] <= 0x20 || rev[i] >= 0x7f)) return false;
        if (i == n || rev[i] == '/') {
            size_t len = i - s;
            if (len == 0 || (len == 1 && rev[s] == '.') ||
                (len == 2 && rev[s] == '.' && rev[s + 1] == '.'))
                return false;
            s = i + 1;
        }
    }
    return true;
}

/* What the ref file holds: a commit hash (hex), possibly followed by a newline. */
static int read_ref(const char *path, char *commit, size_t cap, ckpt_err *err) {
    int kind = place_kind(path); /* remotely: no request for a name the listing lacks */
    if (kind == PLACE_MISSING || kind == PLACE_DIR) return -ENOENT; /* not a ref */
    size_t got;
    int rc = place_read_head(path, commit, cap - 1, &got, NULL);
    if (rc == -EINVAL || kind == PLACE_OTHER)
        return ckpt_fail(err, -EINVAL, "%s: not a regular file (a FIFO or a device?)", path);
    if (rc) return ckpt_fail(err, rc, "%s: %s", path, strerror(-rc));
    ssize_t n = (ssize_t)got;
    while (n > 0 && (commit[n - 1] == '\n' || commit[n - 1] == '\r' || commit[n - 1] == ' ')) n--;
    commit[n] = '\0';
    bool hex = n > 0 && (size_t)n < cap - 1;
    for (ssize_t i = 0; hex && i < n; i++)
        hex = (commit[i] >= '0' && commit[i] <= '9') || (commit[i] >= 'a' && commit[i] <= 'f');
    if (!hex)
        return ckpt_fail(err, -EINVAL,
                         "%s: expected a commit hash (hex digits, at byte offset 0), found "
                         "something else",
                         path);
    return 0;
}

/* A commit hash shortened as git allows (4 to 39 hex digits) that starts exactly one snapshot's
 * name: that name into commit. 0, -ENOENT (none starts so: not a short id) or -EINVAL (several
 * do, named in err). */
static int short_commit(const char *repo, const char *rev, char *commit, size_t cap,
                        ckpt_err *err) {
    size_t n = strlen(rev);
    if (n < 4 || n >= 40) return -ENOENT;
    for (size_t i = 0; i < n; i++)
        if (!((rev[i] >= '0' && rev[i] <= '9') || (rev[i] >= 'a' && rev[i] <= 'f'))) return -ENOENT;
    char snaps[PATH_MAX];
    if (snprintf(snaps, sizeof snaps, "%s/snapshots", repo) >= (int)sizeof snaps) return -ENOENT;
    place_entry *e = NULL;
    size_t count = 0, found = 0, first = 0, second = 0;
    if (place_list(snaps, &e, &count) != 0) return -ENOENT;
    for (size_t i = 0; i < count; i++) {
        if (e[i].kind != PLACE_DIR || strncmp(e[i].name, rev, n) != 0) continue;
        if (found == 0) first = i;
        if (found == 1) second = i;
        found++;
    }
    int rc = -ENOENT;
    if (found == 1 && strlen(e[first].name) < cap) {
        snprintf(commit, cap, "%s", e[first].name);
        rc = 0;
    } else if (found > 1) {
        rc = ckpt_fail(err, -EINVAL,
                       "%s: revision \"%s\" is ambiguous: %zu snapshots start with it (%.60s, "
                       "%.60s%s); give more of the commit hash",
                       repo, rev, found, e[first].name, e[second].name, found > 2 ? ", ..." : "");
    }
    place_list_free(e, count);
    return rc;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const place_entry *)a)->name, ((const place_entry *)b)->name);
}

int hf_cache_root_repos(const char *dir, char *out, size_t cap) {
    place_entry *e = NULL;
    size_t count = 0, repos = 0, o = 0;
    if (cap) out[0] = '\0';
    if (place_list(dir, &e, &count) != 0) return 0;
    if (count) qsort(e, count, sizeof *e, by_name); /* qsort(NULL, 0) is undefined */
    for (size_t i = 0; i < count; i++) {
        if (e[i].kind != PLACE_DIR || strncmp(e[i].name, "models--", 8) != 0) continue;
        char repo[PATH_MAX];
        if (snprintf(repo, sizeof repo, "%s/%s", dir, e[i].name) >= (int)sizeof repo ||
            !hf_cache_probe(repo))
            continue;
        repos++;
        if (o + 4 < cap) {
            int w = snprintf(out + o, cap - o, "%s%s", o ? ", " : "", e[i].name);
            if (w < 0 || (size_t)w >= cap - o) {
                snprintf(out + o, cap - o, "%s...", o ? ", " : "");
                o = cap;
            } else {
                o += (size_t)w;
            }
        }
    }
    place_list_free(e, count);
    return (int)repos;
}

int hf_cache_resolve(const char *repo, const char *revision, char *snapshot, size_t cap,
                     strbuf *doc, ckpt_err *err) {
    const char *rev = revision ? revision : "main";
    if (!revision_ok(rev))
        return ckpt_fail(err, -EINVAL,
                         "revision=%.120s: not a branch, tag or commit name (empty, absolute, "
                         "'.' or '..' components, or control bytes)",
                         rev);
    char ref[PATH_MAX], commit[128];
    int n = snprintf(ref, sizeof ref, "%s/refs/%s", repo, rev);
    if (n < 0 || (size_t)n >= sizeof ref)
        return ckpt_fail(err, -ENAMETOOLONG, "%s/refs/%s: path too long", repo, rev);
    int rc = read_ref(ref, commit, sizeof commit, err);
    bool from_ref = rc == 0;
    if (rc == -ENOENT || rc == -ENOTDIR || rc == -EISDIR) {
        /* Not a ref: a commit hash whose snapshot is there, or the start of exactly one. */
        snprintf(commit, sizeof commit, "%.*s", (int)sizeof commit - 1, rev);
        rc = 0;
        char full[PATH_MAX];
        n = snprintf(full, sizeof full, "%s/snapshots/%s", repo, commit);
        if (n > 0 && (size_t)n < sizeof full && !is_dir(full)) {
            rc = short_commit(repo, rev, commit, sizeof commit, err);
            if (rc == -ENOENT) rc = 0; /* said below: neither a ref nor a snapshot */
        }
    }
    if (rc) return rc;
    n = snprintf(snapshot, cap, "%s/snapshots/%s", repo, commit);
    if (n < 0 || (size_t)n >= cap)
        return ckpt_fail(err, -ENAMETOOLONG, "%s/snapshots/%s: path too long", repo, commit);
    if (!is_dir(snapshot)) {
        if (from_ref)
            return ckpt_fail(err, -ENOENT,
                             "%s: refs/%s names commit %s, but snapshots/%s is missing (an "
                             "interrupted download? fetch it again, or pick another with -o "
                             "revision=)",
                             repo, rev, commit, commit);
        return ckpt_fail(err, -ENOENT,
                         "%s: revision \"%s\" is neither a ref under refs/ nor a snapshot "
                         "under snapshots/",
                         repo, rev);
    }
    char real[PATH_MAX];
    const char *shown = place_resolve(repo, real) == 0 ? real : repo;
    sb_puts(doc, "{\"repo\": ");
    sb_json_str(doc, shown, strlen(shown));
    sb_puts(doc, ", \"revision\": ");
    sb_json_str(doc, rev, strlen(rev));
    sb_puts(doc, ", \"commit\": ");
    sb_json_str(doc, commit, strlen(commit));
    sb_puts(doc, "}");
    return doc->failed ? ckpt_fail(err, -ENOMEM, "out of memory") : 0;
}
