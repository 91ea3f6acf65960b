/* A finished Hugging Face directory put in place of one that exists (a stage committing its
 * directory OUT again). The new directory is swapped in whole with renameat2(RENAME_EXCHANGE),
 * so readers see the old directory or the new one, never a mix. What the writer does not
 * write (README.md, LICENSE, a .git/ ...) is not the writer's to drop: files are hard-linked
 * into the new directory before the swap, directories moved over after it. The weights and
 * the known config/tokenizer files of the old one go: the new directory holds their present
 * state. */
#include "writers.h"

#include "../../formats/formats.h"
#include "../../views/st_layout.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What the safetensors writer puts in a directory: an old copy is replaced, not kept. */
static bool written_by_us(const char *name) {
    if (st_written_name(name)) return true;
    for (size_t i = 0; i < ckpt_hf_aux_count; i++)
        if (strcmp(name, ckpt_hf_aux_names[i]) == 0) return true;
    return false;
}

static bool dot_or_dotdot(const char *name) {
    return strcmp(name, ".") == 0 || strcmp(name, "..") == 0;
}

/* Hard links the old directory's own files into the new one (not directories: see
 * settle_old). */
static int keep_files(int old_fd, int new_fd, const char *out, ckpt_err *err) {
    int fd = dup(old_fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d) rewinddir(d); /* a dup shares the offset an earlier listing moved */
    if (!d) {
        if (fd >= 0) close(fd);
        return ckpt_fail(err, -errno, "%s: cannot list it: %s", out, strerror(errno));
    }
    int rc = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        struct stat s;
        if (dot_or_dotdot(e->d_name) || written_by_us(e->d_name) ||
            fstatat(old_fd, e->d_name, &s, AT_SYMLINK_NOFOLLOW) != 0 ||
            fstatat(new_fd, e->d_name, &(struct stat){0}, AT_SYMLINK_NOFOLLOW) == 0)
            continue;
        if (!S_ISDIR(s.st_mode) && linkat(old_fd, e->d_name, new_fd, e->d_name, 0) != 0)
            rc = ckpt_fail(err, -errno, "%s/%s: cannot keep it in the new directory: %s", out,
                           e->d_name, strerror(errno));
    }
    closedir(d);
    return rc;
}

/* Undoes keep_files. */
static void drop_kept(int new_fd) {
    int fd = dup(new_fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d) rewinddir(d); /* a dup shares the offset an earlier listing moved */
    if (!d) {
        if (fd >= 0) close(fd);
        return;
    }
    for (struct dirent *e; (e = readdir(d));)
        if (!dot_or_dotdot(e->d_name) && !written_by_us(e->d_name)) unlinkat(new_fd, e->d_name, 0);
    closedir(d);
}

/* After the swap, the old directory (now at tmp) gives its subdirectories to the new one
 * and goes. OUT is complete already: a subdirectory that cannot be moved stays in tmp, which
 * the stage's clean-up shows (fs/stage/stage_spool.c). */
static void settle_old(int old_fd, int new_fd, const char *tmp) {
    int fd = dup(old_fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d) rewinddir(d); /* a dup shares the offset an earlier listing moved */
    if (!d) {
        if (fd >= 0) close(fd);
        return;
    }
    for (struct dirent *e; (e = readdir(d));) {
        struct stat s;
        if (dot_or_dotdot(e->d_name) || fstatat(old_fd, e->d_name, &s, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (!S_ISDIR(s.st_mode))
            unlinkat(old_fd, e->d_name, 0);
        else
            renameat(old_fd, e->d_name, new_fd, e->d_name);
    }
    closedir(d);
    unlinkat(AT_FDCWD, tmp, AT_REMOVEDIR);
}

int writer_dir_temp(const char *out, char *tmp, size_t cap, ckpt_err *err) {
    /* ".OUT.partial-XXXXXX" beside OUT, like the file temporaries: hidden and plainly
     * unfinished */
    char *copy_dir = strdup(out), *copy_base = strdup(out);
    int w = copy_dir && copy_base ? snprintf(tmp, cap, "%s/.%s.partial-XXXXXX", dirname(copy_dir),
                                             basename(copy_base))
                                  : -1;
    free(copy_dir);
    free(copy_base);
    if (w < 0 || (size_t)w >= cap || !mkdtemp(tmp)) {
        int e = w < 0 ? ENOMEM : (size_t)w >= cap ? ENAMETOOLONG : errno;
        return ckpt_fail(err, -e, "%s: cannot create a temporary directory: %s", out, strerror(e));
    }
    return 0;
}

int writer_dir_guard(const ckpt_catalog *cat, const char *out, const ckpt_write_opts *opts,
                     ckpt_err *err) {
    char out_real[PATH_MAX], src_real[PATH_MAX];
    struct stat s;
    if (opts->replaces_own_source || stat(out, &s) != 0 || !S_ISDIR(s.st_mode) ||
        !realpath(out, out_real))
        return 0; /* nothing there to replace: the new directory is renamed into place */
    size_t n = strlen(out_real);
    for (uint32_t i = 0; i < cat->nsources; i++) {
        const ckpt_source *src = &cat->sources[i];
        if (src->remote || !realpath(src->path, src_real)) continue;
        if (strncmp(src_real, out_real, n) == 0 && (n == 1 || src_real[n] == '/'))
            return ckpt_fail(err, -EINVAL,
                             "%s holds %s, a file this write reads: replacing the directory "
                             "would remove it; write elsewhere",
                             out, src_real);
    }
    return 0;
}

int writer_replace_dir(const char *tmp, const char *out, ckpt_err *err) {
    int old_fd = open(out, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (old_fd < 0)
        return ckpt_fail(err, -errno, "%s: cannot open the directory to replace: %s", out,
                         strerror(errno));
    int new_fd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (new_fd < 0) {
        int e = errno;
        close(old_fd);
        return ckpt_fail(err, -e, "%s: %s", tmp, strerror(e));
    }
    int rc = keep_files(old_fd, new_fd, out, err);
    if (!rc && fsync(new_fd) != 0)
        rc = ckpt_fail(err, -errno, "%s: fsync: %s", tmp, strerror(errno));
    if (!rc && renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_EXCHANGE) != 0)
        rc = ckpt_fail(err, -errno,
                       "%s: cannot swap the finished directory into place: %s (the old one is "
                       "unchanged)",
                       out, strerror(errno));
    if (!rc)
        settle_old(old_fd, new_fd, tmp); /* OUT is the new directory from here on */
    else
        drop_kept(new_fd); /* the caller removes what it wrote */
    close(old_fd);
    close(new_fd);
    return rc;
}

int writer_publish_dir(const char *tmp, const char *out, const ckpt_write_opts *opts,
                       ckpt_err *err) {
    if (opts->before_publish) {
        int rc = opts->before_publish(opts->publish_ctx, tmp);
        if (rc < 0) return ckpt_fail(err, rc, "%s: not put in place: %s", out, strerror(-rc));
    }
    int rename_errno = rename(tmp, out) != 0 ? errno : 0;
    bool exists = rename_errno == ENOTEMPTY || rename_errno == EEXIST;
    int rc = 0;
    if (exists && opts->replace_dir)
        rc = writer_replace_dir(tmp, out, err); /* a stage committing OUT again */
    else if (rename_errno)
        rc = ckpt_fail(err, -rename_errno, "%s: cannot move the finished directory into place: %s",
                       out,
                       exists ? "it exists and is not empty (a directory is never merged into: "
                                "remove it or give a new name)"
                              : strerror(rename_errno));
    return rc ? rc : out_fsync_dir_of(out);
}
